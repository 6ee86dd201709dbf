//! Point-to-point transmit and its owner rule (`Request::Asattach` with
//! `p2p`), on a simulated cluster (`imcd::sim`): the pages go to one node
//! only, one process per region may send, and a Direct Deposit key
//! (`imc_proto::keys::dd_wire`) may be sent only from its own node to its
//! own destination.

use std::time::Duration;

use imc_proto::keys::dd_wire;
use imc_proto::layout::DATA_FIRST;
use imc_proto::{Reply, Request, Status};
use imcd::daemon::Settings;
use imcd::regions::Cred;
use imcd::sim::{Running, SimNet};
use regs::PAGE_SIZE;

const ME: Cred = Cred { uid: 1000, gid: 100 };

fn start(net: &SimNet, n: usize) -> Running {
    let settings = Settings { cluster_timeout: Duration::from_secs(20), ..Settings::default() };
    let r = net.start(n, &format!("n{n}"), settings);
    assert!(r.joined().is_some(), "node {n} never finished joining");
    r
}

fn call(r: &Running, client: u64, req: Request) -> Reply {
    r.call(req, ME, client).expect("the simulated imcd answers")
}

fn alloc(r: &Running, client: u64, key: u64) -> (u32, u64) {
    match call(r, client, Request::Asalloc { key, size: 2 * PAGE_SIZE, mode: 0o666, exclusive: false, coherent: false })
    {
        Reply::Region { id, first_page, .. } => (id, first_page),
        other => panic!("asalloc {key:#x}: {other:?}"),
    }
}

fn attach(r: &Running, client: u64, id: u32, p2p: Option<u32>) -> Reply {
    call(r, client, Request::Asattach { id, transmit: true, loopback: false, p2p })
}

fn refused(reply: Reply, code: Status, words: &str) {
    match reply {
        Reply::Error { code: c, message } if c == code && message.contains(words) => {}
        other => panic!("expected {code} mentioning {words:?}, got {other:?}"),
    }
}

#[test]
fn a_p2p_attach_programs_the_destination_and_makes_its_process_the_only_sender() {
    let net = SimNet::new(3, DATA_FIRST + 16, Duration::from_micros(20), 41);
    let a = start(&net, 0);
    let _b = start(&net, 1);
    let (id, first) = alloc(&a, 1, 0x55);
    alloc(&a, 2, 0x55);
    assert!(matches!(attach(&a, 1, id, Some(1)), Reply::Mapping { .. }));
    assert_eq!(a.hw().transmit_dest(first), Some(Some(1)), "stores go to node 1 only");
    assert_eq!(a.hw().transmit_dest(first + 1), Some(Some(1)), "on every page of the region");
    // Another process of the node holds the region but may not send on it,
    // point-to-point or broadcast, nor name it as a DMA destination.
    refused(attach(&a, 2, id, Some(1)), Status::Permission, "owned by another process");
    refused(attach(&a, 2, id, None), Status::Permission, "owned by another process");
    refused(call(&a, 2, Request::DmaTarget { id }), Status::NotAlloc, "not attached region");
    assert_eq!(call(&a, 1, Request::DmaTarget { id }), Reply::DmaTarget { id, first_page: first, pages: 2 });
    // The owner lets go: the other process may take the region over.
    assert_eq!(call(&a, 1, Request::Dealloc { id }), Reply::Done);
    assert!(matches!(attach(&a, 2, id, Some(2)), Reply::Mapping { .. }));
    assert_eq!(a.hw().transmit_dest(first), Some(Some(2)));
}

#[test]
fn a_region_another_process_sends_on_cannot_become_p2p_and_bad_destinations_are_refused() {
    let net = SimNet::new(2, DATA_FIRST + 16, Duration::from_micros(20), 42);
    let a = start(&net, 0);
    let (id, first) = alloc(&a, 1, 0x66);
    alloc(&a, 2, 0x66);
    assert!(matches!(attach(&a, 1, id, None), Reply::Mapping { .. }));
    assert_eq!(a.hw().transmit_dest(first), Some(None), "a plain attach broadcasts");
    refused(attach(&a, 2, id, Some(1)), Status::Permission, "attached for transmit by another process");
    refused(attach(&a, 1, id, Some(0)), Status::Invalid, "this node");
    refused(attach(&a, 1, id, Some(64)), Status::Invalid, "nodes are 0 to 63");
    refused(
        call(&a, 1, Request::Asattach { id, transmit: true, loopback: true, p2p: Some(1) }),
        Status::Invalid,
        "loopback",
    );
    assert_eq!(a.hw().transmit_dest(first), Some(None), "refusals changed nothing");
}

#[test]
fn a_direct_deposit_key_is_sent_only_from_its_node_to_its_node() {
    let net = SimNet::new(3, DATA_FIRST + 16, Duration::from_micros(20), 43);
    let a = start(&net, 0);
    let b = start(&net, 1);
    let c = start(&net, 2);
    let key = dd_wire(0, 1, 7);
    let (id, first) = alloc(&b, 1, key);
    let (id_a, _) = alloc(&a, 1, key);
    let (id_c, _) = alloc(&c, 1, key);
    assert_eq!((id_a, id_c), (id, id));
    // The receiving node and a third node may not send on it at all.
    refused(attach(&b, 1, id, Some(0)), Status::Permission, "sent from node 0 only");
    refused(attach(&c, 1, id, Some(1)), Status::Permission, "sent from node 0 only");
    refused(attach(&c, 1, id, None), Status::Permission, "sent from node 0 only");
    // The sending node only point-to-point, and only to node 1.
    refused(attach(&a, 1, id, None), Status::Permission, "to node 1");
    refused(attach(&a, 1, id, Some(2)), Status::Permission, "to node 1");
    assert_eq!(a.hw().transmit_dest(first), None, "nothing was enabled");
    assert!(matches!(attach(&a, 1, id, Some(1)), Reply::Mapping { .. }));
    assert_eq!(a.hw().transmit_dest(first), Some(Some(1)));
    // A second process of the sending node is refused.
    alloc(&a, 2, key);
    refused(attach(&a, 2, id, Some(1)), Status::Permission, "owned by another process");
}
