//! The SQLite file each service keeps its tokens in, as operators' mistakes
//! and sick disks meet it.
//!
//! The lease service's counter and the proxy's max tokens must never go
//! back. SQLite keeps them safe from crashes (WAL, `synchronous=FULL`); this
//! module keeps them safe from what SQLite cannot see:
//!
//! - **A database that is not there** is never created on a normal start:
//!   a missing file is a lost database as often as a first start, and a
//!   new one would count from the start again ([`Opening`]). Creating is
//!   the operator's explicit act (`--create-db`), and a re-created database
//!   can start above a floor the operator gives (`--token-floor`).
//! - **A read-only or full disk** at start is found by a write before the
//!   service listens ([`probe_writable`]), and named as such.
//! - **A file deleted, moved over or written by another process** while
//!   the service runs ([`Watch`]): SQLite would go on writing the unlinked
//!   file (lost at restart) or mix its pages with a copied-in backup. The
//!   watch is checked before every write; once it fails, every write fails
//!   with the reason (the service answers 503 and is not ready) until a
//!   restart, and the connection is not checkpointed into the file that
//!   replaced it ([`Watch::lost`]: the owner leaks it).
//! - **Repeated failures** are logged once a second with a count of the
//!   rest ([`Throttle`]), not once per request.

mod ledger;

pub use ledger::{Kind, Level, Mark};
use ledger::{guard, require_kind, unreadable};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How a service may open its database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Only an existing file (a normal start).
    Existing,
    /// Create the file if it is missing (`--create-db`; `fencegate dev`).
    CreateIfMissing,
}

/// Before SQLite opens `path` (`what`: "lease database"): refuses a missing
/// file unless `opening` allows creating it; returns whether it will be
/// created.
pub fn prepare(path: &Path, opening: Opening, what: &str) -> anyhow::Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    match opening {
        Opening::CreateIfMissing => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    anyhow::anyhow!(
                        "cannot create the directory of the {what} {}: {e}",
                        path.display()
                    )
                })?;
            }
            Ok(true)
        }
        Opening::Existing => anyhow::bail!(
            "the {what} {} does not exist. On a first start, pass --create-db. If it existed \
             before, it was lost: a new one would count tokens from the start again, below tokens \
             already in use. Restore it from a backup (stopped service, then `fencegate restore-db`), \
             or create a new one with --create-db --token-floor N, N above every token ever issued \
             (README, \"A lost database\")",
            path.display()
        ),
    }
}

/// A service's database as [`open`] hands it over: checked, its schema in
/// place, at or above its high-water mark, watched and claimed.
#[derive(Debug)]
pub struct Opened {
    pub conn: rusqlite::Connection,
    /// Whether this open created the file.
    pub created: bool,
    pub mark: Mark,
    pub watch: Watch,
    pub claim: Claim,
}

/// Opens the `kind` database at `path` the one way both services do:
/// created only as `opening` allows, probed for a writable disk, refused
/// when it is of another kind or empty (unless it may be new), put in WAL
/// with `synchronous=FULL`, given its schema by `schema`, held to its
/// high-water mark and lifted to `floor` ([`guard`]), then watched and
/// claimed. Every error names the file (and, where it may be damaged,
/// `restore-db`).
pub fn open(
    path: &Path,
    opening: Opening,
    kind: Kind,
    floor: u64,
    schema: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<()>,
) -> anyhow::Result<Opened> {
    let what = kind.what();
    let created = prepare(path, opening, what)?;
    let conn = rusqlite::Connection::open(path)
        .map_err(|e| anyhow::anyhow!(unreadable(kind, path, &e)))?;
    probe_writable(&conn, path, what)?;
    // A file of the other service, an empty one, or no database at all is
    // refused before anything is written into it.
    require_kind(
        &conn,
        path,
        kind,
        created || opening == Opening::CreateIfMissing,
    )?;
    let init = || -> rusqlite::Result<()> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        schema(&conn)
    };
    init().map_err(|e| anyhow::anyhow!(unreadable(kind, path, &e)))?;
    let mark = guard(&conn, path, kind, floor)?;
    let watch = Watch::new(path, what)?;
    let claim = claim(path)?;
    Ok(Opened {
        conn,
        created,
        mark,
        watch,
        claim,
    })
}

/// Writes nothing, in a write transaction: fails on a read-only file or
/// filesystem, or a disk SQLite cannot write, with a message that says
/// which.
pub fn probe_writable(conn: &rusqlite::Connection, path: &Path, what: &str) -> anyhow::Result<()> {
    let probe = conn
        .execute_batch("BEGIN IMMEDIATE; CREATE TABLE IF NOT EXISTS probe_writable (x); DROP TABLE probe_writable; COMMIT;");
    let Err(e) = probe else {
        return Ok(());
    };
    let _ = conn.execute_batch("ROLLBACK");
    if read_only_fs(path) {
        anyhow::bail!(
            "the {what} {} is on a read-only filesystem (SQLite: {e}); remount it read-write \
             (a filesystem the kernel remounted read-only after I/O errors needs checking first)",
            path.display()
        );
    }
    anyhow::bail!(
        "cannot write the {what} {}: {e}. If the disk is fine and the file is damaged, stop the \
         service and restore a backup with `fencegate restore-db --db PATH --from BACKUP`",
        path.display()
    )
}

/// Least free space on the filesystem of a database for its service to be
/// ready: a commit may need to grow the write-ahead log by a few pages,
/// and SQLite needs room for its checkpoint.
const MIN_FREE_BYTES: u64 = 1024 * 1024;

/// Why the filesystem holding the `what` at `path` cannot take a commit
/// now (full, or nearly), if it cannot: readiness says so before a write
/// fails, and until one can succeed again. An empty write transaction
/// succeeds on a full disk, so it proves nothing.
pub fn space_problem(path: &Path, what: &str) -> Option<String> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    #[allow(
        clippy::useless_conversion,
        reason = "the field types differ by platform"
    )]
    let free = u64::from(s.blocks_available()).saturating_mul(u64::from(s.fragment_size()));
    (free < MIN_FREE_BYTES).then(|| {
        format!(
            "the filesystem of the {what} {} has {free} bytes free (less than {MIN_FREE_BYTES}): commits would fail; free space on it",
            path.display()
        )
    })
}

/// Whether the filesystem holding `path` is mounted read-only.
pub fn read_only_fs(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    nix::sys::statvfs::statvfs(dir)
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
}

/// A file's identity: device and inode.
type FileId = (u64, u64);

/// What the watch expects the database file to be.
#[derive(Debug)]
pub struct Watch {
    path: PathBuf,
    what: String,
    id: FileId,
    /// Length and modification time after this service's last write: the
    /// main file changes only when this service writes (WAL mode: at its
    /// checkpoints, which run inside its commits).
    after_write: (u64, i64, i64),
    /// The write-ahead log's identity after the last write, if it had one.
    wal: Option<FileId>,
    lost: Option<String>,
}

impl Watch {
    /// Watches the database at `path` as it is now (just opened).
    pub fn new(path: &Path, what: &str) -> std::io::Result<Watch> {
        let m = std::fs::metadata(path)?;
        Ok(Watch {
            path: path.to_owned(),
            what: what.to_owned(),
            id: (m.dev(), m.ino()),
            after_write: (m.len(), m.mtime(), m.mtime_nsec()),
            wal: wal_id(path),
            lost: None,
        })
    }

    /// Before a write: fails if the file was deleted, replaced or written
    /// by another process since the last write; once failed, always.
    pub fn check(&mut self) -> Result<(), String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        let why = match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Some("was deleted while the service ran".to_owned())
            }
            Err(e) => Some(format!("cannot be checked ({e})")),
            Ok(m) if (m.dev(), m.ino()) != self.id => {
                Some("was replaced by another file while the service ran (moved or restored over it)".to_owned())
            }
            Ok(m) if (m.len(), m.mtime(), m.mtime_nsec()) != self.after_write => Some(
                "was written by another process while the service ran (a backup copied over it?)"
                    .to_owned(),
            ),
            Ok(_) => match (self.wal, wal_id(&self.path)) {
                (Some(before), now) if now != Some(before) => Some(
                    "lost its write-ahead log (-wal file deleted or replaced) while the service ran".to_owned(),
                ),
                _ => None,
            },
        };
        let Some(why) = why else {
            return Ok(());
        };
        let why = format!(
            "the {} {} {why}: refusing to write until a restart. Its last writes may be lost: \
             restore a backup with `fencegate restore-db` (service stopped), or start with \
             --create-db --token-floor N above every token issued (README, \"A lost database\")",
            self.what,
            self.path.display()
        );
        tracing::error!(target: "fencegate::database", "{why}");
        self.lost = Some(why.clone());
        Err(why)
    }

    /// After a write that succeeded: the file as it is now is ours.
    pub fn written(&mut self) {
        if self.lost.is_some() {
            return;
        }
        if let Ok(m) = std::fs::metadata(&self.path) {
            self.after_write = (m.len(), m.mtime(), m.mtime_nsec());
        }
        self.wal = wal_id(&self.path);
    }

    /// The watched file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the database was given up, if it was: its connection must then
    /// not be closed normally (a close checkpoints the WAL into whatever
    /// file now has the name).
    pub fn lost(&self) -> Option<&str> {
        self.lost.as_deref()
    }
}

fn wal_id(path: &Path) -> Option<FileId> {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    std::fs::metadata(wal).ok().map(|m| (m.dev(), m.ino()))
}

/// A log of a failure that repeats: the first line at once, then at most
/// one a second, saying how many were not logged.
#[derive(Debug, Default)]
pub struct Throttle {
    last: Option<Instant>,
    held_back: u64,
}

impl Throttle {
    /// Whether to log now, and how many were held back since the last line.
    pub fn ready(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|l| now.duration_since(l) < Duration::from_secs(1))
        {
            self.held_back += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held_back))
    }

    /// Back to healthy: the next failure is logged at once.
    pub fn reset(&mut self) {
        self.last = None;
        self.held_back = 0;
    }
}

/// A service's claim on its database file for as long as it runs (a
/// shared `flock`, apart from SQLite's own locks): [`in_use`] sees it.
#[derive(Debug)]
pub struct Claim(
    #[allow(dead_code, reason = "held for its drop")] nix::fcntl::Flock<std::fs::File>,
);

/// Claims the database at `path` for this process.
pub fn claim(path: &Path) -> anyhow::Result<Claim> {
    let file = std::fs::File::open(path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockSharedNonblock)
        .map(Claim)
        .map_err(|(_, e)| anyhow::anyhow!("cannot claim {}: {e}", path.display()))
}

/// Whether a running service has claimed the database at `path`.
pub fn in_use(path: &Path) -> bool {
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
}

/// Copies `backup` over the database at `db` while its service is stopped.
///
/// The backup must be a database SQLite reads whole, of the same kind as
/// the database it replaces (by its tables, the replaced file's and the
/// mark's), and at least at the high-water mark (`ledger`), unless `floor`
/// is at least the mark's token: then the copy is lifted to `floor` before
/// it is put in place. The old write-ahead log and shared memory are
/// removed (SQLite would otherwise replay the old database's log onto the
/// restored one), and the file is replaced atomically (copy to a temporary
/// name, fsync, rename, fsync the directory). `running` says whether a
/// service still has `db` open. Returns the restored database's kind and
/// level.
pub fn restore(
    backup: &Path,
    db: &Path,
    floor: u64,
    running: impl Fn() -> bool,
) -> anyhow::Result<(Kind, ledger::Level)> {
    anyhow::ensure!(
        !running(),
        "a service still has {} open: stop it first (a running service would write its own state back over the restored file)",
        db.display()
    );
    let (kind, level) = {
        let conn = rusqlite::Connection::open_with_flags(
            backup,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )
        .map_err(|e| anyhow::anyhow!("cannot open the backup {}: {e}", backup.display()))?;
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .map_err(|e| {
                anyhow::anyhow!(
                    "the backup {} is not a readable database: {e}",
                    backup.display()
                )
            })?;
        anyhow::ensure!(
            check == "ok",
            "the backup {} is damaged: {check}",
            backup.display()
        );
        let kind = match Kind::of(&conn) {
            Ok(Some(kind)) => kind,
            Ok(None) => anyhow::bail!(
                "the backup {} holds no fencegate tables (an empty file or an empty database): \
                 a service started on it would count tokens from 0 again; restore a backup of the \
                 service's own database",
                backup.display()
            ),
            Err(why) => anyhow::bail!(
                "the backup {} is not a fencegate database: {why}",
                backup.display()
            ),
        };
        (kind, kind.level(&conn)?)
    };
    let replaced =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()
            .and_then(|c| Kind::of(&c).ok().flatten());
    let marked = ledger::read_mark(&ledger::mark_path(db))?;
    for (whose, other) in [
        (db.display().to_string(), replaced),
        (
            ledger::mark_path(db).display().to_string(),
            marked.map(|(k, _)| k),
        ),
    ] {
        if let Some(other) = other.filter(|o| *o != kind) {
            anyhow::bail!(
                "the backup {} is a {}, but {whose} is a {}'s: restore each service's database from its own backups",
                backup.display(),
                kind.what(),
                other.what()
            );
        }
    }
    let marked = marked.map(|(_, l)| l).unwrap_or_default();
    let below = level.below(marked);
    if below && marked.above(floor) {
        anyhow::bail!(ledger::below_mark(
            kind,
            &format!("the backup {}", backup.display()),
            &ledger::mark_path(db),
            level,
            marked,
            "Restoring it"
        ));
    }
    let dir = db
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = db.as_os_str().to_owned();
    tmp.push(".restoring");
    let tmp = PathBuf::from(tmp);
    std::fs::copy(backup, &tmp)?;
    let mut level = level;
    if floor > 0 || below {
        // Lifted in the copy, and the copy's own log folded in by the close.
        let conn = rusqlite::Connection::open(&tmp)?;
        kind.lift(&conn, floor, marked.generation)?;
        level = kind.level(&conn)?;
        conn.pragma_update(None, "journal_mode", "DELETE")?;
    }
    std::fs::File::open(&tmp)?.sync_all()?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = db.as_os_str().to_owned();
        side.push(suffix);
        match std::fs::remove_file(PathBuf::from(side)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    std::fs::rename(&tmp, db)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok((kind, level))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(path: &Path) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(path).expect("open");
        c.pragma_update(None, "journal_mode", "WAL").expect("wal");
        c.execute_batch(
            "CREATE TABLE IF NOT EXISTS t (x);
             CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY, last_token INTEGER NOT NULL);
             INSERT OR IGNORE INTO counter VALUES (1, 0);
             CREATE TABLE IF NOT EXISTS leases (lock TEXT PRIMARY KEY);",
        )
        .expect("table");
        c
    }

    #[test]
    fn a_missing_database_is_created_only_when_told() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("sub/x.db");
        let e = prepare(&path, Opening::Existing, "lease database").expect_err("missing");
        assert!(e.to_string().contains("--create-db"), "{e}");
        assert!(prepare(&path, Opening::CreateIfMissing, "lease database").expect("create"));
        db(&path);
        assert!(!prepare(&path, Opening::Existing, "lease database").expect("exists"));
    }

    #[test]
    fn the_watch_sees_deletion_replacement_and_foreign_writes() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("x.db");
        let conn = db(&path);
        let mut w = Watch::new(&path, "lease database").expect("watch");
        w.check().expect("intact");
        conn.execute("INSERT INTO t VALUES (1)", []).expect("write");
        w.written();
        w.check().expect("our own write");

        // Written by another process (a copy over it, in place).
        std::fs::write(&path, b"not ours").expect("overwrite");
        let why = w.check().expect_err("foreign write");
        fencegate_testkit::assert_mentions(&why, &["written by another process"]);
        assert!(w.check().is_err() && w.lost().is_some(), "lost for good");

        // Deleted, and replaced.
        let path = dir.path().join("y.db");
        let _conn = db(&path);
        let mut w = Watch::new(&path, "proxy database").expect("watch");
        std::fs::remove_file(&path).expect("rm");
        assert!(w.check().expect_err("deleted").contains("deleted"));
        let path = dir.path().join("z.db");
        let _conn = db(&path);
        let mut w = Watch::new(&path, "proxy database").expect("watch");
        std::fs::write(dir.path().join("other"), b"x").expect("other");
        std::fs::rename(dir.path().join("other"), &path).expect("mv");
        assert!(w.check().expect_err("replaced").contains("replaced"));
    }

    #[test]
    fn a_restore_refuses_a_running_service_and_drops_the_old_log() {
        let dir = tempfile::tempdir().expect("dir");
        let (live, backup) = (dir.path().join("live.db"), dir.path().join("backup.db"));
        {
            let b = db(&backup);
            b.execute("INSERT INTO t VALUES ('backup')", [])
                .expect("write");
        }
        let conn = db(&live);
        conn.execute("INSERT INTO t VALUES ('newest')", [])
            .expect("write");
        let claimed = claim(&live).expect("claim");
        assert!(in_use(&live));
        assert!(
            restore(&backup, &live, 0, || in_use(&live)).is_err(),
            "running"
        );
        drop(claimed);
        assert!(!in_use(&live));
        // The live service stops without a checkpoint: its log is left.
        std::mem::forget(conn);
        let mut wal = live.as_os_str().to_owned();
        wal.push("-wal");
        assert!(Path::new(&wal).exists());
        restore(&backup, &live, 0, || false).expect("restore");
        assert!(!Path::new(&wal).exists(), "the old log is gone");
        let c = rusqlite::Connection::open(&live).expect("open");
        let x: String = c
            .query_row("SELECT x FROM t", [], |r| r.get(0))
            .expect("row");
        assert_eq!(x, "backup");
        assert!(std::fs::write(dir.path().join("junk.db"), b"junk").is_ok());
        assert!(
            restore(&dir.path().join("junk.db"), &live, 0, || false).is_err(),
            "not a database"
        );
    }

    #[test]
    fn a_repeated_failure_is_logged_once_a_second_with_a_count() {
        let mut t = Throttle::default();
        assert_eq!(t.ready(), Some(0));
        assert_eq!(t.ready(), None);
        assert_eq!(t.ready(), None);
        t.reset();
        assert_eq!(t.ready(), Some(0));
    }
}
