//! A PostgreSQL server of a test's own: a fresh cluster in a temporary directory, listening
//! on a free loopback port, stopped and removed when dropped. For the exactly-once
//! projection tests and the demo's read model. Finds PostgreSQL's programs in
//! `TESSERA_POSTGRES_BIN`, Debian's `/usr/lib/postgresql/<version>/bin` (the newest), or the
//! `PATH`; `scripts/ensure-deps.sh` installs Debian's `postgresql` where none is. PostgreSQL
//! refuses to run as root, so as root the server runs as the `postgres` user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    #[error(
        "PostgreSQL is not installed (no initdb in TESSERA_POSTGRES_BIN, \
         /usr/lib/postgresql/*/bin or the PATH): run scripts/ensure-deps.sh as root, or \
         apt-get install postgresql"
    )]
    NotInstalled,
    #[error("{command}: {reason}")]
    Command { command: String, reason: String },
    #[error("the PostgreSQL server did not accept connections within {START_TIMEOUT:?}: {log}")]
    NotReady { log: String },
}

/// A running server; dropping it stops the server and deletes its files.
pub struct PostgresServer {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
    server: Option<Child>,
    _dir: tempfile::TempDir,
}

impl PostgresServer {
    /// Starts a server with user `tessera` (no password, loopback only) and database
    /// `postgres`, and waits until it accepts connections.
    pub async fn start() -> Result<PostgresServer, PostgresError> {
        let bin = find_bin().ok_or(PostgresError::NotInstalled)?;
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("tessera-postgres-")
            .tempdir()
            .map_err(|e| command_error("a temporary directory", e))?;
        let data = dir.path().join("data");
        std::fs::create_dir(&data).map_err(|e| command_error("mkdir data", e))?;
        if as_postgres {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .map_err(|e| command_error("chmod", e))?;
            run(Command::new("chown").args(["postgres:postgres"]).arg(&data))?;
        }
        let mut server = PostgresServer {
            bin,
            data,
            port: free_port()?,
            as_postgres,
            server: None,
            _dir: dir,
        };
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(&server.data).args([
            "-U",
            "tessera",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        ]);
        run(&mut initdb)?;
        let log = server.data.join("server.log");
        let log_file =
            std::fs::File::create(&log).map_err(|e| command_error("the server's log", e))?;
        if as_postgres {
            run(Command::new("chown").args(["postgres:postgres"]).arg(&log))?;
        }
        let mut postgres = server.command("postgres");
        postgres
            .arg("-D")
            .arg(&server.data)
            .arg("-p")
            .arg(server.port.to_string())
            .arg("-k")
            .arg(&server.data)
            .args([
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=200",
                // Tests check fencing by when each row's transaction committed.
                "-c",
                "track_commit_timestamp=on",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        server.server = Some(postgres.spawn().map_err(|e| command_error("postgres", e))?);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            match tokio_postgres::connect(&server.connection_string(), tokio_postgres::NoTls).await
            {
                Ok(_) => return Ok(server),
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => {
                    let log = std::fs::read_to_string(&log).unwrap_or_default();
                    return Err(PostgresError::NotReady {
                        log: format!("{e}; server log: {log}"),
                    });
                }
            }
        }
    }

    /// The libpq connection string of database `postgres` as user `tessera`.
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=tessera dbname=postgres connect_timeout=5",
            self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        // An immediate stop: the data is thrown away with the directory.
        let mut stop = self.command("pg_ctl");
        stop.arg("-D")
            .arg(&self.data)
            .args(["stop", "-m", "immediate", "-w", "-t", "10"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = stop.status();
        if let Some(mut server) = self.server.take() {
            let _ = server.kill();
            let _ = server.wait();
        }
    }
}

fn find_bin() -> Option<PathBuf> {
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Some(dir) = std::env::var_os("TESSERA_POSTGRES_BIN").map(PathBuf::from) {
        return has_initdb(&dir).then_some(dir);
    }
    let mut debian: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            has_initdb(&bin).then_some((version, bin))
        })
        .collect();
    debian.sort();
    if let Some((_, bin)) = debian.pop() {
        return Some(bin);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).find(|dir| has_initdb(dir))
}

fn free_port() -> Result<u16, PostgresError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| command_error("a free port", e))
}

fn command_error(command: &str, e: std::io::Error) -> PostgresError {
    PostgresError::Command {
        command: command.to_string(),
        reason: e.to_string(),
    }
}

fn run(command: &mut Command) -> Result<(), PostgresError> {
    let shown = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| command_error(&shown, e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(PostgresError::Command {
            command: shown,
            reason: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
