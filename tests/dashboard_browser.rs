//! The live dashboard in headless Chromium: three `tessera node`
//! processes; the page at node 1 shows the three members up with their shards; node 3 is
//! SIGKILLed and, on the same page (never reloaded: the point is the live event stream), its
//! row turns unreachable, then removed (or disappears) once the split-brain resolver downs it
//! and the cluster removes it. The projections panel shows the account example's two
//! projections (into a PostgreSQL server of the test's own) with every instance running.
//!
//! Chromium is driven over WebDriver by Debian's `chromedriver`; where `chromium` or
//! `chromedriver` is missing (`scripts/ensure-deps.sh` installs both as root) the test says so
//! and returns. `DASHBOARD_SCREENSHOT=docs/dashboard.png` writes the page, three members up,
//! to that path (the name is outside `TESSERA_*`, which the nodes check).

mod common;

use common::{free_port, kill, one_at_a_time, test_dir, wait_up};
use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera_example_account::projections::INSTANCES;
use tessera_harness::demo::NodeProcess;
use tessera_harness::postgres::PostgresServer;
use tokio::process::{Child, Command};

/// Longest wait for anything the page should show.
const PAGE_WAIT: Duration = Duration::from_secs(60);
/// Longest wait for chromedriver to answer.
const DRIVER_START_WAIT: Duration = Duration::from_secs(30);
/// How often the page is read while waiting.
const POLL_INTERVAL: Duration = Duration::from_millis(200);
/// Failure detection and downing in seconds.
const QUICK: [&str; 2] = ["--stable-after", "2s"];
/// Accounts deposited into, so that the sharding table shows live entities.
const ACCOUNTS: usize = 12;
/// Where a screenshot of the page with three members up is written, when set.
const SCREENSHOT_VAR: &str = "DASHBOARD_SCREENSHOT";

/// The members table as the page shows it: one object per row.
const READ_MEMBERS: &str = r#"
    return [...document.querySelectorAll('#members tbody tr[data-address]')].map((row) => ({
        address: row.dataset.address,
        status: row.querySelector('td.status').textContent,
        reachability: row.querySelector('td.reachability').textContent,
        leader: row.querySelector('td.leader').textContent,
    }));
"#;

/// The projections' instance tables: [projection, index, node, state] per instance.
const READ_PROJECTIONS: &str = r#"
    return [...document.querySelectorAll('[data-projection] tbody tr')].map((row) => [
        row.closest('[data-projection]').dataset.projection,
        ...[...row.cells].slice(0, 3).map((cell) => cell.textContent),
    ]);
"#;

/// The sharding table of `account`: one object per node.
const READ_SHARDS: &str = r#"
    return [...document.querySelectorAll('[data-type="account"] tbody tr[data-address]')]
        .map((row) => [...row.cells].map((cell) => cell.textContent));
"#;

#[tokio::test]
async fn dashboard_shows_members_live_through_a_kill_and_a_removal() {
    let Some(browser) = Browser::find() else {
        return;
    };
    let _serial = one_at_a_time().await;
    let started = Instant::now();
    let dir = test_dir();
    let database = PostgresServer::start().await.expect("PostgreSQL starts");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let mut nodes = Vec::new();
    for i in 0..3 {
        nodes.push(spawn(i, &ports, dir.path(), &database).await);
    }
    wait_up(&nodes.iter().collect::<Vec<_>>(), 3).await;
    deposit(&nodes).await;

    check_event_stream_starts_with_the_state(nodes[0].http).await;

    let driver = browser.start(dir.path()).await;
    let page = driver.session(dir.path()).await;
    page.goto(&format!("http://{}/", nodes[0].http))
        .await
        .expect("open the dashboard");
    // Set once: still there at the end only if the page was never reloaded.
    page.execute("window.loadedOnce = true; return null;", vec![])
        .await
        .expect("mark the page");

    wait_page(&page, "three members up and reachable", |members, _| {
        members.len() == 3
            && members
                .iter()
                .all(|m| m["status"] == "up" && m["reachability"] == "reachable")
            && members.iter().filter(|m| m["leader"] == "leader").count() == 1
    })
    .await;
    wait_page(&page, "each node's shards of account", |_, shards| {
        let live: usize = shards
            .iter()
            .filter_map(|row| row[2].as_str()?.parse::<usize>().ok())
            .sum();
        shards.len() == 3 && live == ACCOUNTS
    })
    .await;
    let start = Instant::now();
    loop {
        let rows = read_rows(&page, READ_PROJECTIONS).await;
        if rows.len() == 2 * INSTANCES as usize && rows.iter().all(|r| r[3] == "running") {
            println!("page: every projection instance running: {rows:?}");
            break;
        }
        assert!(
            start.elapsed() < PAGE_WAIT,
            "page: the projections' instances not all running: {rows:?}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    if let Some(path) = std::env::var_os(SCREENSHOT_VAR) {
        let path = PathBuf::from(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("the screenshot's directory");
        }
        let png = page.screenshot().await.expect("screenshot");
        std::fs::write(&path, png).expect("write the screenshot");
        println!("screenshot written to {}", path.display());
    }

    let victim = nodes[2].cluster.clone();
    let killed = Instant::now();
    kill(&mut nodes[2]).await;
    wait_page(&page, "the killed node shown unreachable", |members, _| {
        members
            .iter()
            .any(|m| m["address"] == victim.as_str() && m["reachability"] == "unreachable")
    })
    .await;
    println!(
        "unreachable on the page {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    );
    wait_page(&page, "the killed node removed", |members, _| {
        members
            .iter()
            .filter(|m| m["address"] == victim.as_str())
            .all(|m| m["status"] == "removed")
    })
    .await;
    println!(
        "removed on the page {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let survivors = read_members(&page).await;
    assert_eq!(
        survivors
            .iter()
            .filter(|m| m["status"] == "up" && m["reachability"] == "reachable")
            .count(),
        2,
        "{survivors:?}"
    );
    let same_page = page
        .execute("return window.loadedOnce === true;", vec![])
        .await
        .expect("read the mark");
    assert_eq!(same_page, json!(true), "the page was reloaded");

    page.close().await.expect("close the browser session");
    println!("dashboard test: {:.1}s", started.elapsed().as_secs_f64());
}

async fn spawn(i: usize, ports: &[u16], dir: &Path, database: &PostgresServer) -> NodeProcess {
    common::spawn_with_read_models(i, ports, dir, &QUICK, database).await
}

/// One deposit into each of [`ACCOUNTS`] accounts, through the nodes in turn, each retried
/// until it is answered 200 (the regions register with the coordinator after Up).
async fn deposit(nodes: &[NodeProcess]) {
    let deadline = Instant::now() + PAGE_WAIT;
    for account in 0..ACCOUNTS {
        let node = &nodes[account % nodes.len()];
        loop {
            let answer = common::deposits::command(
                node.http,
                &format!("acct-{account}"),
                r#"{"deposit": 1}"#,
            )
            .await;
            if answer.status == 200 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "deposit into acct-{account} not answered 200: {} {}",
                answer.status,
                answer.body
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

/// `GET /cluster/events` without a browser: the first event is the whole membership.
async fn check_event_stream_starts_with_the_state(http: SocketAddr) {
    let mut response = reqwest::Client::new()
        .get(format!("http://{http}/cluster/events"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .expect("GET /cluster/events");
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let data = loop {
        if let Some(frame_end) = text.find("\n\n") {
            let frame = &text[..frame_end];
            if let Some(data) = frame
                .strip_prefix("event: current-state\n")
                .and_then(|rest| rest.strip_prefix("data: "))
            {
                break data.to_string();
            }
            panic!("the stream does not start with current-state: {text:?}");
        }
        let chunk = response
            .chunk()
            .await
            .expect("the stream")
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
    };
    let state: Value = serde_json::from_str(&data).expect("JSON");
    let members = state["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{state}");
    assert!(members.iter().all(|m| m["status"] == "up"), "{state}");
    assert_eq!(state["unreachable"], json!([]), "{state}");
    assert!(state["leader"].is_string(), "{state}");
}

/// Waits until `done` holds for the page's members and `account` shard rows; fails after
/// [`PAGE_WAIT`] with what the page showed.
async fn wait_page(page: &Client, what: &str, mut done: impl FnMut(&[Value], &[Value]) -> bool) {
    let start = Instant::now();
    loop {
        let members = read_members(page).await;
        let shards = read_rows(page, READ_SHARDS).await;
        if done(&members, &shards) {
            println!("page: {what} after {:.1}s", start.elapsed().as_secs_f64());
            return;
        }
        if start.elapsed() > PAGE_WAIT {
            let text = page
                .execute("return document.body.innerText;", vec![])
                .await
                .unwrap_or_default();
            panic!(
                "page: {what}: not shown within {PAGE_WAIT:?}; members {members:?}, shards \
                 {shards:?}; the page reads:\n{}",
                text.as_str().unwrap_or_default()
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

async fn read_members(page: &Client) -> Vec<Value> {
    read_rows(page, READ_MEMBERS).await
}

async fn read_rows(page: &Client, script: &str) -> Vec<Value> {
    let rows = page.execute(script, vec![]).await.expect("read the page");
    rows.as_array().cloned().unwrap_or_default()
}

/// Debian's Chromium and ChromeDriver, found on `PATH`.
struct Browser {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

impl Browser {
    /// Both programs, or None after saying which is missing.
    fn find() -> Option<Self> {
        let chromium = on_path("chromium").or_else(|| on_path("chromium-browser"));
        let chromedriver = on_path("chromedriver");
        match (chromium, chromedriver) {
            (Some(chromium), Some(chromedriver)) => Some(Self {
                chromium,
                chromedriver,
            }),
            (chromium, chromedriver) => {
                let missing: Vec<&str> = [
                    chromium.is_none().then_some("chromium"),
                    chromedriver
                        .is_none()
                        .then_some("chromedriver (chromium-driver)"),
                ]
                .into_iter()
                .flatten()
                .collect();
                println!(
                    "SKIPPED: the dashboard's browser test needs {} on PATH; as root, \
                     scripts/ensure-deps.sh installs them (apt-get install chromium \
                     chromium-driver)",
                    missing.join(" and ")
                );
                None
            }
        }
    }

    /// Starts chromedriver on a free loopback port and waits until it answers.
    async fn start(&self, dir: &Path) -> Driver {
        let port = free_port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).expect("driver log");
        let child = Command::new(&self.chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().expect("driver log")))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let start = Instant::now();
        let status = format!("http://{address}/status");
        loop {
            // reqwest, not tessera's http_client: chromedriver writes `Content-Length:250`.
            let answer = reqwest::Client::new()
                .get(&status)
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            if answer.is_ok_and(|a| a.status() == 200) {
                break;
            }
            assert!(
                start.elapsed() < DRIVER_START_WAIT,
                "chromedriver did not answer on {address} within {DRIVER_START_WAIT:?}; see {}",
                dir.join("chromedriver.log").display()
            );
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Driver {
            _child: child,
            address,
            chromium: self.chromium.clone(),
        }
    }
}

/// A running chromedriver, killed when dropped.
struct Driver {
    _child: Child,
    address: SocketAddr,
    chromium: PathBuf,
}

impl Driver {
    /// A headless Chromium session with its own profile, 1280 × 900, with none of Chromium's
    /// background traffic (this machine has no network beyond loopback).
    async fn session(&self, dir: &Path) -> Client {
        let profile = dir.join("chromium-profile");
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": self.chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object literal")
        };
        ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://{}", self.address))
            .await
            .expect("a Chromium session")
    }
}

/// The first file called `name` in a directory of `PATH`.
fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}
