//! The soak test's short form in the QEMU tier: `mc-soak` (what
//! `scripts/soak.sh` runs) on 3 guests for 3 minutes under seeded faults.
//! Every kind of fault is injected at least once (the plan starts with one
//! of each) and must be detected; nothing may be lost outside an announced
//! outage, reordered, miscounted under the lock or hung.

use std::process::Command;

#[test]
#[ignore = "QEMU tier: boots 3 guests for about 5 minutes (scripts/test.sh runs it)"]
fn soak_short_form_passes() {
    let _one_cluster_at_a_time = tests::serial();
    let out = Command::new(env!("CARGO_BIN_EXE_mc-soak"))
        .args(["--nodes", "3", "--minutes", "3", "--seed", "7", "--fault-every", "20", "--name", "soak-ci"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    let run =
        std::env::var_os("MC_RUN_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| tests::root().join(".run"));
    let result: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join("soak-ci/share/soak/result.json")).expect("result.json written"),
    )
    .unwrap();
    let kinds: std::collections::BTreeSet<&str> =
        result["faults"].as_array().unwrap().iter().map(|f| f["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), 5, "every kind of fault was injected: {kinds:?}");
    assert_eq!(result["faults_detected"], result["faults_injected"], "every fault detected:\n{text}");
    assert!(result["writes_checked"].as_u64().unwrap() > 1000, "writes were checked:\n{text}");
    assert!(result["lock_rounds"].as_u64().unwrap() > 100, "the lock was taken:\n{text}");
    assert!(result["ump_pings"].as_u64().unwrap() > 100, "UMP pinged:\n{text}");
    for k in ["lost_unannounced", "reorders", "corrupt", "lock_error", "ump_unannounced", "hangs"] {
        assert_eq!(result[k], 0, "{k} must be 0:\n{text}");
    }
    assert!(out.status.success(), "mc-soak failed:\n{text}");
}
