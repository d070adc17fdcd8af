//! What a database holds that must never go back, and the high-water mark
//! kept beside it that says how far it went.
//!
//! SQLite keeps committed writes in its write-ahead log until a checkpoint
//! copies them into the main file. Lose the `-wal` file while the service
//! is stopped and SQLite opens the main file as it was at the last
//! checkpoint, without a word: the lease service's counter went from 20 to
//! 0, the proxy's max from 2 to 0. A restore of an older backup does the
//! same on purpose. Neither can be seen from inside the database, so each
//! service also keeps a [`Mark`] (`<db>.mark`): the highest level its
//! database ever reached, written and fsync'd after each commit that
//! raises it and before the answer that relies on it goes out. A start,
//! a `--create-db` and a restore compare the database's [`Level`] with
//! the mark and refuse a database below it, naming both numbers, unless
//! the operator gives a floor at least the mark's token.
//!
//! The mark is written after the commit, so a crash between the two leaves
//! the mark below the database (which is fine), never above it. It has two
//! checksummed slots written in turn, so a torn write leaves the other.
//! Losing the mark together with the log is not detected; the README says
//! to keep them together.

use std::fs::File;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};

/// Which service's database a file is, by its tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The lease service's: `counter` and `leases`.
    Lease,
    /// The proxy's: `fences` and `meta`.
    Proxy,
}

/// How far a database went: `generation` counts the commits that raised
/// it (the lease service's counter, the proxy's raises), `token` is the
/// highest token it issued or admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Level {
    pub generation: u64,
    pub token: u64,
}

impl Level {
    /// This level is below `mark`: fewer raises, or a lower token (the
    /// fence's own rule: a token below the mark is stale).
    pub fn below(self, mark: Level) -> bool {
        self.generation < mark.generation || fencegate_core::fence::is_stale(mark.token, self.token)
    }

    /// `floor` does not reach this level's token: starting there could
    /// issue or admit a token below it.
    pub fn above(self, floor: u64) -> bool {
        fencegate_core::fence::is_stale(self.token, floor)
    }
}

impl Kind {
    /// What the file is called in messages.
    pub const fn what(self) -> &'static str {
        match self {
            Kind::Lease => "lease database",
            Kind::Proxy => "proxy database",
        }
    }

    fn byte(self) -> u8 {
        match self {
            Kind::Lease => 1,
            Kind::Proxy => 2,
        }
    }

    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Lease),
            2 => Some(Kind::Proxy),
            _ => None,
        }
    }

    /// Which kind the open database is, if any: None for a database with
    /// no tables (an empty file is one), an error for one whose tables are
    /// another application's, or both services'. A lease database is the
    /// one with `counter`, a proxy database the one with `fences` (the
    /// tables every version of each had).
    pub fn of(conn: &rusqlite::Connection) -> Result<Option<Kind>, String> {
        let tables = tables(conn).map_err(|e| e.to_string())?;
        let has = |t: &str| tables.iter().any(|n| n == t);
        match (has("counter"), has("fences")) {
            (true, false) => Ok(Some(Kind::Lease)),
            (false, true) => Ok(Some(Kind::Proxy)),
            (true, true) => Err(
                "it holds both a lease database's counter and a proxy database's fences".to_owned(),
            ),
            (false, false) if tables.is_empty() => Ok(None),
            (false, false) => Err(format!(
                "its tables ({}) are no fencegate database's (a lease database has counter, a proxy database fences)",
                tables.join(", ")
            )),
        }
    }

    /// The database's level (0 for what an older version did not keep).
    pub fn level(self, conn: &rusqlite::Connection) -> rusqlite::Result<Level> {
        let tables = tables(conn)?;
        let one = |table: &str, sql: &str| -> rusqlite::Result<u64> {
            if !tables.iter().any(|n| n == table) {
                return Ok(0);
            }
            conn.query_row(sql, [], |r| r.get::<_, Option<i64>>(0))
                .map(|v| v.map_or(0, |v| u64::try_from(v).unwrap_or(0)))
        };
        Ok(match self {
            Kind::Lease => {
                let t = one("counter", "SELECT MAX(last_token) FROM counter")?;
                Level {
                    generation: t,
                    token: t,
                }
            }
            Kind::Proxy => Level {
                generation: one(
                    "meta",
                    "SELECT MAX(value) FROM meta WHERE name = 'generation'",
                )?,
                token: one("fences", "SELECT MAX(max_token) FROM fences")?.max(one(
                    "meta",
                    "SELECT MAX(value) FROM meta WHERE name = 'floor'",
                )?),
            },
        })
    }

    /// Raises the database to at least `floor` (its tokens) and
    /// `generation`, in one transaction.
    pub fn lift(
        self,
        conn: &rusqlite::Connection,
        floor: u64,
        generation: u64,
    ) -> rusqlite::Result<()> {
        let (floor, generation) = (to_sql(floor), to_sql(generation));
        match self {
            Kind::Lease => conn
                .execute(
                    "UPDATE counter SET last_token = MAX(last_token, ?1, ?2) WHERE id = 1",
                    [floor, generation],
                )
                .map(drop),
            Kind::Proxy => conn.execute_batch(&format!(
                "BEGIN IMMEDIATE;
                 CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
                 INSERT INTO meta (name, value) VALUES ('floor', {floor})
                     ON CONFLICT (name) DO UPDATE SET value = MAX(value, {floor});
                 INSERT INTO meta (name, value) VALUES ('generation', {generation})
                     ON CONFLICT (name) DO UPDATE SET value = MAX(value, {generation});
                 COMMIT;"
            )),
        }
    }
}

/// The database's own tables (not SQLite's, not the writable probe's).
fn tables(conn: &rusqlite::Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table'
         AND name NOT LIKE 'sqlite_%' AND name != 'probe_writable' ORDER BY name",
    )?;
    let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
    names.collect()
}

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Where the mark of the database at `db` is kept.
pub(crate) fn mark_path(db: &Path) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(".mark");
    PathBuf::from(p)
}

const MAGIC: &[u8; 8] = b"FGMARK1\0";
const SLOT: u64 = 64;

/// One slot: magic, kind, sequence, generation, token, checksum.
fn encode(kind: Kind, seq: u64, level: Level) -> [u8; 48] {
    let mut b = [0u8; 48];
    b[..8].copy_from_slice(MAGIC);
    b[8] = kind.byte();
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b[24..32].copy_from_slice(&level.generation.to_le_bytes());
    b[32..40].copy_from_slice(&level.token.to_le_bytes());
    let sum = checksum(&b[..40]);
    b[40..48].copy_from_slice(&sum.to_le_bytes());
    b
}

fn decode(b: &[u8]) -> Option<(Kind, u64, Level)> {
    if b.len() < 48 || &b[..8] != MAGIC {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    if checksum(&b[..40]) != word(40) {
        return None;
    }
    Some((
        Kind::from_byte(b[8])?,
        word(16),
        Level {
            generation: word(24),
            token: word(32),
        },
    ))
}

/// FNV-1a, 64 bits: catches a torn or foreign slot, not an adversary (who
/// could as well delete the file).
fn checksum(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// What a mark file holds, read without opening it for writing.
pub(crate) fn read_mark(path: &Path) -> anyhow::Result<Option<(Kind, Level)>> {
    Ok(newest_slot(path)?.map(|(kind, _, level)| (kind, level)))
}

/// The newest whole slot of the mark at `path`: its kind, sequence and
/// level (None: no mark, or an empty one).
fn newest_slot(path: &Path) -> anyhow::Result<Option<(Kind, u64, Level)>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("cannot read the high-water mark {}: {e}", path.display()),
    };
    if bytes.is_empty() {
        return Ok(None);
    }
    let slots = [
        bytes.get(..48),
        bytes.get(SLOT as usize..SLOT as usize + 48),
    ];
    slots
        .into_iter()
        .flatten()
        .filter_map(decode)
        .max_by_key(|(_, seq, _)| *seq)
        .map(Some)
        .ok_or_else(|| {
            anyhow::anyhow!(
                "the high-water mark {} is unreadable (neither of its slots is whole): \
                 move it aside and start with --token-floor N, N above every token ever issued \
                 (README, \"A lost database\")",
                path.display()
            )
        })
}

/// The high-water mark of one database, open for as long as its service
/// runs.
#[derive(Debug)]
pub struct Mark {
    path: PathBuf,
    file: File,
    kind: Kind,
    seq: u64,
    level: Level,
}

impl Mark {
    /// The level the mark holds.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Records `level` if it is above the mark (either number), fsync'd
    /// before it returns. A mark file deleted or replaced since is written
    /// anew at its path (emptied first: a replaced file's slots are not
    /// ours). A failure is a storage error of the commit it follows.
    pub fn record(&mut self, level: Level) -> rusqlite::Result<()> {
        self.write(level).map_err(|e| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
                Some(format!(
                    "cannot write the high-water mark {}: {e}",
                    self.path.display()
                )),
            )
        })
    }

    fn write(&mut self, level: Level) -> std::io::Result<()> {
        let level = Level {
            generation: level.generation.max(self.level.generation),
            token: level.token.max(self.level.token),
        };
        if level == self.level {
            return Ok(());
        }
        let ours = self.file.metadata().map(|m| (m.dev(), m.ino()))?;
        if std::fs::metadata(&self.path)
            .map(|m| (m.dev(), m.ino()))
            .ok()
            != Some(ours)
        {
            self.file = create(&self.path)?;
            self.file.set_len(0)?;
        }
        self.seq += 1;
        self.file
            .write_all_at(&encode(self.kind, self.seq, level), (self.seq % 2) * SLOT)?;
        self.file.sync_data()?;
        self.level = level;
        Ok(())
    }
}

fn create(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

/// At start, after the database is open (and created, if it was):
/// compares its level with its mark and refuses a database below it,
/// unless `floor` is at least the mark's token; then lifts the database
/// to `floor` and the mark's generation, and records the result. Returns
/// the mark, to record each later raise with.
pub(crate) fn guard(
    conn: &rusqlite::Connection,
    db: &Path,
    kind: Kind,
    floor: u64,
) -> anyhow::Result<Mark> {
    let path = mark_path(db);
    let (seq, marked) = match newest_slot(&path)? {
        Some((k, _, _)) if k != kind => anyhow::bail!(
            "the high-water mark {} belongs to a {}, but {} is opened as a {}: \
             each service needs its own database file",
            path.display(),
            k.what(),
            db.display(),
            kind.what()
        ),
        Some((_, seq, level)) => (seq, level),
        None => (0, Level::default()),
    };
    let level = kind.level(conn)?;
    if level.below(marked) {
        if marked.above(floor) {
            let subject = format!("the {} {}", kind.what(), db.display());
            let why = below_mark(kind, &subject, &path, level, marked, "Starting it");
            tracing::error!(target: "fencegate::database", "{why}");
            anyhow::bail!(why);
        }
        tracing::warn!(
            target: "fencegate::database",
            db = %db.display(),
            floor,
            mark = marked.token,
            "the {} was below its high-water mark; started above it at the floor the operator gave",
            kind.what()
        );
    }
    if floor > 0 || level.generation < marked.generation {
        kind.lift(conn, floor, marked.generation)?;
    }
    let level = kind.level(conn)?;
    let file = create(&path)
        .map_err(|e| anyhow::anyhow!("cannot open the high-water mark {}: {e}", path.display()))?;
    let mut mark = Mark {
        path,
        file,
        kind,
        seq,
        level: marked,
    };
    mark.record(level)?;
    Ok(mark)
}

/// The refusal of a database below its mark: `subject` names it ("the
/// lease database X", "the backup Y"), `mark` is the mark's file, `act`
/// what would follow ("Starting it").
pub(crate) fn below_mark(
    kind: Kind,
    subject: &str,
    mark: &Path,
    level: Level,
    marked: Level,
    act: &str,
) -> String {
    let numbers = match kind {
        Kind::Lease => format!(
            "holds last token {}, but the high-water mark {} says token {} was issued",
            level.token,
            mark.display(),
            marked.token
        ),
        Kind::Proxy => format!(
            "holds {} raises (highest max {}), but the high-water mark {} says {} raises were made (highest max {})",
            level.generation,
            level.token,
            mark.display(),
            marked.generation,
            marked.token
        ),
    };
    let effect = match kind {
        Kind::Lease => "would issue tokens already in use again",
        Kind::Proxy => "would admit stale tokens that its lost raises had fenced",
    };
    format!(
        "{subject} {numbers}: it lost writes (its -wal file was deleted, or an older copy was put in place). \
         {act} {effect}. Restore the newest backup with `fencegate restore-db` and, if that is older \
         than the mark, pass --token-floor {} (or higher: above every token ever issued; README, \"A lost database\")",
        marked.token
    )
}

/// Before a service writes its schema into the database it opened at
/// `path`: refuses a file of the other kind, one that is no fencegate
/// database, and an empty one unless the service may create a new
/// database (`may_be_new`: `--create-db`, or the file was just created).
pub(crate) fn require_kind(
    conn: &rusqlite::Connection,
    path: &Path,
    kind: Kind,
    may_be_new: bool,
) -> anyhow::Result<()> {
    match Kind::of(conn) {
        Ok(Some(k)) if k == kind => Ok(()),
        Ok(Some(other)) => anyhow::bail!(
            "{} is a {}, not a {}: give each service its own database file{}",
            path.display(),
            other.what(),
            kind.what(),
            RESTORE
        ),
        Ok(None) if may_be_new => Ok(()),
        Ok(None) => anyhow::bail!(
            "the {} {} is empty (it holds no tables): a start on it would count tokens from 0 again. \
             On a first start, pass --create-db{}",
            kind.what(),
            path.display(),
            RESTORE
        ),
        Err(why) => anyhow::bail!(unreadable(kind, path, &why)),
    }
}

/// What to do about a database that is lost or damaged.
const RESTORE: &str = ". If it was lost or damaged, stop the service and restore a backup with \
     `fencegate restore-db --db PATH --from BACKUP`, or start with --create-db --token-floor N, \
     N above every token ever issued (README, \"A lost database\")";

/// The error of a database SQLite cannot read, naming the file and the fix.
pub(crate) fn unreadable(kind: Kind, path: &Path, why: &dyn std::fmt::Display) -> String {
    format!(
        "the {} {} cannot be read ({why}){RESTORE}",
        kind.what(),
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_db(path: &Path, last: u64) -> rusqlite::Connection {
        let c = rusqlite::Connection::open(path).expect("open");
        c.execute_batch(&format!(
            "CREATE TABLE counter (id INTEGER PRIMARY KEY, last_token INTEGER NOT NULL);
             INSERT INTO counter VALUES (1, {last});
             CREATE TABLE leases (lock TEXT PRIMARY KEY);"
        ))
        .expect("schema");
        c
    }

    #[test]
    fn a_database_is_known_by_its_tables() {
        let dir = tempfile::tempdir().expect("dir");
        let empty = rusqlite::Connection::open(dir.path().join("e.db")).expect("open");
        assert_eq!(Kind::of(&empty), Ok(None));
        let lease = lease_db(&dir.path().join("l.db"), 3);
        assert_eq!(Kind::of(&lease), Ok(Some(Kind::Lease)));
        // A proxy database of a version before `meta`.
        let old = rusqlite::Connection::open(dir.path().join("p.db")).expect("open");
        old.execute_batch("CREATE TABLE fences (scope TEXT PRIMARY KEY, max_token INTEGER NOT NULL); INSERT INTO fences VALUES ('b', 9);")
            .expect("schema");
        assert_eq!(Kind::of(&old), Ok(Some(Kind::Proxy)));
        assert_eq!(
            Kind::Proxy.level(&old).expect("level"),
            Level {
                generation: 0,
                token: 9
            }
        );
        let other = rusqlite::Connection::open(dir.path().join("o.db")).expect("open");
        other
            .execute_batch("CREATE TABLE users (x)")
            .expect("schema");
        assert!(
            Kind::of(&other)
                .expect_err("another app's")
                .contains("users")
        );
    }

    #[test]
    fn the_mark_survives_a_torn_slot_and_refuses_a_database_below_it() {
        let dir = tempfile::tempdir().expect("dir");
        let db = dir.path().join("l.db");
        let conn = lease_db(&db, 0);
        let mut mark = guard(&conn, &db, Kind::Lease, 0).expect("first start");
        for t in 1..=5 {
            mark.record(Level {
                generation: t,
                token: t,
            })
            .expect("record");
        }
        drop(mark);
        // The slot written last torn: the other still says 4.
        let path = mark_path(&db);
        let mut bytes = std::fs::read(&path).expect("mark");
        let seq = newest_slot(&path).expect("read").expect("a mark").1;
        let last = if seq.is_multiple_of(2) { 0 } else { 64 };
        bytes[last + 30] ^= 0xff;
        std::fs::write(&path, &bytes).expect("tear");
        assert_eq!(
            read_mark(&path).expect("read"),
            Some((
                Kind::Lease,
                Level {
                    generation: 4,
                    token: 4
                }
            ))
        );
        // The database says 0: below the mark, refused unless the floor
        // reaches it; then lifted.
        let e = guard(&conn, &db, Kind::Lease, 3).expect_err("below");
        assert!(e.to_string().contains("--token-floor 4"), "{e}");
        guard(&conn, &db, Kind::Lease, 4).expect("the floor reaches the mark");
        assert_eq!(Kind::Lease.level(&conn).expect("level").token, 4);
        // The other service's mark is refused.
        let e = guard(&conn, &db, Kind::Proxy, 100).expect_err("other kind");
        assert!(e.to_string().contains("belongs to a lease database"), "{e}");
    }
}
