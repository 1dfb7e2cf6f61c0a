//! A PostgreSQL cluster of the test's own (Debian package `postgresql`): `initdb` in a temp
//! folder, `pg_ctl` on a free loopback port, stopped and deleted when dropped. As root (CI)
//! the server runs as the `postgres` user, since PostgreSQL refuses to run as root. Shared
//! by the tests and the bench example.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A running cluster; stopped when dropped.
pub struct Postgres {
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    running: bool,
}

/// The newest `/usr/lib/postgresql/<version>/bin`.
fn binaries() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (Debian package postgresql); .ci/run installs it")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("no initdb under /usr/lib/postgresql/*/bin")
        .1
}

/// A loopback port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Runs `program` as the user that owns the cluster.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn check(output: Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl Postgres {
    /// Creates a cluster and starts it.
    pub fn start() -> Postgres {
        let bin = binaries();
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown the cluster's folder to postgres");
        }
        let output = as_owner(&bin.join("initdb"))
            .arg("-D")
            .arg(dir.path().join("data"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .output()
            .unwrap();
        check(output, "initdb");
        let mut postgres = Postgres {
            port: free_port(),
            dir,
            bin,
            running: false,
        };
        postgres.restart();
        postgres
    }

    /// Starts the server (again) on the same port and data.
    pub fn restart(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let output = as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .arg("-l")
            .arg(self.dir.path().join("log"))
            .args(["-w", "-t", "30", "-o", &options, "start"])
            .output()
            .unwrap();
        check(output, "pg_ctl start");
        self.running = true;
    }

    /// Stops the server (fast: open transactions roll back).
    pub fn stop(&mut self) {
        if !self.running {
            return;
        }
        let output = as_owner(&self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "fast", "-w", "-t", "30", "stop"])
            .output()
            .unwrap();
        check(output, "pg_ctl stop");
        self.running = false;
    }

    /// Turns TLS on with this certificate and key (PEM), and restarts: `ssl = on`, the
    /// files copied into the data folder, the key readable by the server's user only.
    pub fn enable_tls(&mut self, cert: &Path, key: &Path) {
        self.stop();
        let data = self.dir.path().join("data");
        std::fs::copy(cert, data.join("server.crt")).unwrap();
        std::fs::copy(key, data.join("server.key")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            data.join("server.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        if is_root() {
            for file in ["server.crt", "server.key"] {
                let status = Command::new("chown")
                    .arg("postgres:postgres")
                    .arg(data.join(file))
                    .status()
                    .unwrap();
                assert!(status.success());
            }
        }
        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        use std::io::Write;
        writeln!(
            conf,
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'"
        )
        .unwrap();
        self.restart();
    }

    /// A connection string for this cluster.
    pub fn url(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=5",
            self.port
        )
    }

    /// A new connection.
    pub fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.url(), postgres::NoTls)
            .expect("connect to the test cluster")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
