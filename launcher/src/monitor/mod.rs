//! `mc-cluster monitor`: a live page of a running cluster, served on
//! 127.0.0.1 for a teacher's or a student's browser. The address carries a
//! random token; a request without it gets 403.
//!
//! - [`view`]: the page's one JSON document, built from the hub's answers.
//! - this module: the HTTP server (axum) and the sampling task.
//!
//! Routes (each needs `?token=`): `/` the page (`page.html`), `/api/state`
//! the latest [`view::View`], `/api/events` the same as server-sent events
//! at every sample, `/api/fault` (POST JSON `{"op": "link-down" |
//! "link-up" | "corrupt" | "delay", "node": N, "value": V}`) a fault on
//! purpose through the hub's control socket, noted on the timeline.
//!
//! Threads: a current-thread tokio runtime of its own runs the server and
//! one sampling task, which asks the hub's control socket (`stats`,
//! `observe`) every interval, reads new lines of the supervisor's
//! `events.log`, and publishes the view on a watch channel the handlers
//! read.

pub mod view;

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use view::{Sample, Tracker, DIR_COPY_PAGES};

/// The page (HTML, CSS and script in one file; no build step).
const PAGE: &str = include_str!("page.html");
/// Longest a hub answer may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(5);

/// What the monitor watches and how.
pub struct Options {
    /// The hub's control socket (`.run/NAME/hub.ctl`).
    pub control: PathBuf,
    /// The supervisor's event log (`.run/NAME/events.log`), if any.
    pub events_log: Option<PathBuf>,
    /// Port on 127.0.0.1 (0: any free one).
    pub port: u16,
    /// Time between samples.
    pub interval: Duration,
    /// The access token (random if None).
    pub token: Option<String>,
}

struct Shared {
    token: String,
    control: PathBuf,
    latest: watch::Receiver<String>,
    tracker: Arc<Mutex<Tracker>>,
    start: Instant,
}

/// A random token: 16 bytes of the kernel's randomness, hex.
pub fn random_token() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .context("reading /dev/urandom for the monitor's token")?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// One request to the hub's control socket; its JSON answer.
pub async fn hub_request(control: &Path, req: &Value) -> Result<Value> {
    let work = async {
        let mut s = UnixStream::connect(control)
            .await
            .with_context(|| format!("connecting to the hub's control socket {}", control.display()))?;
        let mut line = serde_json::to_vec(req)?;
        line.push(b'\n');
        s.write_all(&line).await?;
        let mut r = BufReader::new(s);
        let mut answer = String::new();
        r.read_line(&mut answer).await?;
        if answer.is_empty() {
            bail!("the hub closed its control socket without answering");
        }
        Ok(serde_json::from_str::<Value>(&answer)?)
    };
    tokio::time::timeout(CTL_TIMEOUT, work).await.context("the hub did not answer its control socket in time")?
}

/// The control request a fault button asks for.
fn fault_request(op: &str, node: u16, value: Option<u64>) -> Result<Value, String> {
    Ok(match op {
        "link-down" => json!({"cmd": "link_down", "node": node}),
        "link-up" => json!({"cmd": "link_up", "node": node}),
        "corrupt" => json!({"cmd": "corrupt", "node": node, "count": value.unwrap_or(10)}),
        "delay" => json!({"cmd": "delay", "node": node, "micros": value.unwrap_or(0)}),
        other => return Err(format!("unknown fault {other:?} (link-down, link-up, corrupt, delay)")),
    })
}

/// Compares the request's `token` parameter with ours (in time that does
/// not depend on where they differ).
fn token_ok(query: Option<&str>, token: &str) -> bool {
    let given = query.unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("token=")).unwrap_or("");
    given.len() == token.len() && given.bytes().zip(token.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

async fn guard(State(sh): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if token_ok(req.uri().query(), &sh.token) {
        next.run(req).await
    } else {
        (StatusCode::FORBIDDEN, "forbidden: use the address mc-cluster monitor printed (it carries the access token)\n")
            .into_response()
    }
}

async fn page() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE)
}

async fn state(State(sh): State<Arc<Shared>>) -> impl IntoResponse {
    let body = sh.latest.borrow().clone();
    ([(header::CONTENT_TYPE, "application/json")], body)
}

async fn events(State(sh): State<Arc<Shared>>) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let stream = WatchStream::new(sh.latest.clone()).map(|doc| Ok(SseEvent::default().data(doc)));
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[derive(Deserialize)]
struct Fault {
    op: String,
    node: u16,
    value: Option<u64>,
}

async fn fault(State(sh): State<Arc<Shared>>, Json(f): Json<Fault>) -> Response {
    let req = match fault_request(&f.op, f.node, f.value) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(json!({"error": e}))).into_response(),
    };
    let t = sh.start.elapsed().as_secs_f64();
    match hub_request(&sh.control, &req).await {
        Ok(a) if a["reply"] == "ok" => {
            let what = match f.value {
                Some(v) => format!("{} node {} ({v}) from the monitor", f.op, f.node),
                None => format!("{} node {} from the monitor", f.op, f.node),
            };
            sh.tracker.lock().unwrap_or_else(|e| e.into_inner()).note(t, "fault", what);
            Json(json!({"ok": true})).into_response()
        }
        Ok(a) => {
            let msg = a["message"].as_str().unwrap_or("refused").to_string();
            (StatusCode::BAD_REQUEST, Json(json!({"error": msg}))).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, Json(json!({"error": format!("{e:#}")}))).into_response(),
    }
}

/// Reads the lines added to `log` since `pos`.
fn new_lines(log: &Path, pos: &mut u64) -> Vec<String> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(log) else { return Vec::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len < *pos {
        *pos = 0;
    }
    let mut buf = String::new();
    if f.seek(SeekFrom::Start(*pos)).is_err() || f.read_to_string(&mut buf).is_err() {
        return Vec::new();
    }
    // Whole lines only; a partial last line waits for the next look.
    let whole = buf.rfind('\n').map_or(0, |i| i + 1);
    *pos += whole as u64;
    buf[..whole].lines().map(str::to_string).collect()
}

async fn sample_loop(
    control: PathBuf,
    events_log: Option<PathBuf>,
    interval: Duration,
    tracker: Arc<Mutex<Tracker>>,
    start: Instant,
    tx: watch::Sender<String>,
) {
    // The supervisor's log from the end: what happens from now on.
    let mut pos = events_log.as_deref().and_then(|l| std::fs::metadata(l).ok()).map_or(0, |m| m.len());
    let mut tick = tokio::time::interval(interval);
    loop {
        tick.tick().await;
        let t = start.elapsed().as_secs_f64();
        let observe = json!({"cmd": "observe", "first": 0, "count": DIR_COPY_PAGES});
        let doc = match (hub_request(&control, &json!({"cmd": "stats"})).await, hub_request(&control, &observe).await) {
            (Ok(stats), Ok(observe)) => {
                let mut tr = tracker.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(log) = &events_log {
                    for l in new_lines(log, &mut pos) {
                        tr.note(t, "event", l);
                    }
                }
                match tr.update(&Sample { t, stats, observe }) {
                    Ok(v) => serde_json::to_string(&v).unwrap_or_default(),
                    Err(e) => json!({"error": e.to_string(), "t": t}).to_string(),
                }
            }
            (Err(e), _) | (_, Err(e)) => json!({"error": format!("{e:#}"), "t": t}).to_string(),
        };
        if tx.send(doc).is_err() {
            return;
        }
    }
}

/// The router over `sh` (every route behind the token).
fn router(sh: Arc<Shared>) -> Router {
    Router::new()
        .route("/", get(page))
        .route("/api/state", get(state))
        .route("/api/events", get(events))
        .route("/api/fault", post(fault))
        .layer(middleware::from_fn_with_state(sh.clone(), guard))
        .with_state(sh)
}

/// Serves until the process is stopped; `ready` gets the page's address
/// (with the token) once the socket listens.
pub fn serve(opts: Options, ready: impl FnOnce(&str)) -> Result<()> {
    let token = match opts.token {
        Some(t) => t,
        None => random_token()?,
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", opts.port))
            .await
            .with_context(|| format!("listening on 127.0.0.1:{}", opts.port))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = watch::channel(json!({"error": "no sample yet", "t": 0.0}).to_string());
        let tracker = Arc::new(Mutex::new(Tracker::default()));
        let start = Instant::now();
        let sh = Arc::new(Shared {
            token: token.clone(),
            control: opts.control.clone(),
            latest: rx,
            tracker: tracker.clone(),
            start,
        });
        tokio::spawn(sample_loop(opts.control, opts.events_log, opts.interval, tracker, start, tx));
        ready(&format!("http://{addr}/?token={token}"));
        axum::serve(listener, router(sh)).await.context("serving the monitor")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_checked_whole() {
        let t = "00ff";
        assert!(token_ok(Some("token=00ff"), t));
        assert!(token_ok(Some("a=1&token=00ff"), t));
        for bad in [None, Some(""), Some("token="), Some("token=00fe"), Some("token=00ff0"), Some("tok=00ff")] {
            assert!(!token_ok(bad, t), "{bad:?}");
        }
        let r = random_token().unwrap();
        assert_eq!(r.len(), 32);
        assert_ne!(r, random_token().unwrap());
    }

    #[test]
    fn fault_buttons_become_control_requests() {
        assert_eq!(fault_request("link-down", 2, None).unwrap(), json!({"cmd": "link_down", "node": 2}));
        assert_eq!(fault_request("corrupt", 1, None).unwrap(), json!({"cmd": "corrupt", "node": 1, "count": 10}));
        assert_eq!(fault_request("delay", 1, Some(500)).unwrap(), json!({"cmd": "delay", "node": 1, "micros": 500}));
        assert!(fault_request("reboot", 1, None).unwrap_err().contains("unknown fault"));
    }

    #[test]
    fn the_event_log_is_read_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("events.log");
        std::fs::write(&log, "one\ntw").unwrap();
        let mut pos = 0;
        assert_eq!(new_lines(&log, &mut pos), ["one"]);
        std::fs::write(&log, "one\ntwo\nthree\n").unwrap();
        assert_eq!(new_lines(&log, &mut pos), ["two", "three"]);
        assert!(new_lines(&log, &mut pos).is_empty());
        std::fs::write(&log, "new\n").unwrap();
        assert_eq!(new_lines(&log, &mut pos), ["new"], "a log started again is read from its start");
    }
}
