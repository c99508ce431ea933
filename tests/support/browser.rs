//! Debian's Chromium, headless, driven by its chromedriver over the W3C WebDriver
//! protocol: JSON over HTTP, spoken here by hand, so the tests need no browser download
//! and no client crate (scripts/install/chromium.sh installs both programs).

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

pub struct Browser {
    driver: Child,
    address: String,
    session: String,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A browser with a `width` × `height` window; None (the test skips) where Chromium is
    /// not installed, unless PETTING_REQUIRE_BROWSER (scripts/test.sh) says it must be.
    pub fn start(width: u32, height: u32) -> Option<Browser> {
        if !Path::new(CHROMEDRIVER).exists() || !Path::new(CHROMIUM).exists() {
            assert!(
                std::env::var_os("PETTING_REQUIRE_BROWSER").is_none(),
                "PETTING_REQUIRE_BROWSER is set but {CHROMIUM} or {CHROMEDRIVER} is missing (scripts/install/chromium.sh)"
            );
            eprintln!("no Chromium (scripts/install/chromium.sh installs it): browser checks skipped");
            return None;
        }
        let port = super::free_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen on {address}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        // The flags a closed network needs: without them Chromium keeps calling Google's hosts.
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let reply = request(&address, "POST", "/session", Some(&capabilities));
        let session = reply["value"]["sessionId"].as_str().expect("a WebDriver session").to_string();
        Some(Browser { driver, address, session, _profile: profile })
    }

    pub fn goto(&self, url: &str) {
        self.command("POST", "url", Some(&json!({"url": url})));
    }

    /// The value `script` returns, run in the page as a function body.
    pub fn eval(&self, script: &str) -> Value {
        self.command("POST", "execute/sync", Some(&json!({"script": script, "args": []})))
    }

    /// Waits up to `seconds` for `script` to return something truthy, and returns it.
    pub fn wait_for(&self, script: &str, seconds: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        loop {
            let value = self.eval(script);
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value.as_f64() != Some(0.0)
                && value.as_str() != Some("");
            if truthy {
                return value;
            }
            assert!(Instant::now() < deadline, "waited {seconds} s for: {script}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The window as a PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let encoded = self.command("GET", "screenshot", None);
        base64::engine::general_purpose::STANDARD.decode(encoded.as_str().expect("base64 text")).unwrap()
    }

    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let reply = request(&self.address, method, &format!("/session/{}/{path}", self.session), body);
        reply["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ =
            std::panic::catch_unwind(|| request(&self.address, "DELETE", &format!("/session/{}", self.session), None));
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One WebDriver call (chromedriver answers HTTP/1.1 only, each answer with its length).
fn request(address: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut stream = std::net::TcpStream::connect(address).expect("chromedriver answers");
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body.as_bytes()).unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut json = vec![0; length];
    reader.read_exact(&mut json).unwrap();
    let value: Value = serde_json::from_slice(&json)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}: {}", String::from_utf8_lossy(&json)));
    if let Some(error) = value["value"]["error"].as_str() {
        panic!("{method} {path}: {error}: {}", value["value"]["message"]);
    }
    value
}
