//! Durable state of the lease service in SQLite.
//!
//! Two tables: `counter` (one row: the last token issued) and `leases` (the
//! current lease per lock, with the SHA-256 digest of the idempotency key
//! its acquire sent, so a client whose answer was lost to a crash can still
//! prove it is the holder after the restart). The database runs in WAL mode. A commit that
//! issues a new token runs with `synchronous=FULL`, so the WAL is fsync'd
//! before the grant is answered; a commit that only renews or releases runs
//! with `synchronous=NORMAL` (written to the OS, not fsync'd; see
//! ARCHITECTURE.md for why safety does not depend on it).
//!
//! The file itself is `fencegate_durable`'s to guard: created only when
//! told (a new database can start above a floor), refused when it is not a
//! lease database or is below its high-water mark (a lost `-wal`, an older
//! copy), probed for a read-only disk before the service listens, and
//! watched before every commit for being deleted, replaced or written by
//! someone else. Each commit that issues a token raises the mark.

use fencegate_core::{KeyDigest, Lease, LockName, Timestamp};
use fencegate_durable::{Opening, Watch};
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;

/// Which service's database the file is.
const KIND: fencegate_durable::Kind = fencegate_durable::Kind::Lease;

/// The lease service's SQLite file.
#[derive(Debug)]
pub struct Store {
    /// Not closed when the file was lost: a close would checkpoint the
    /// log into whatever file now has the name.
    conn: Connection,
    watch: Watch,
    /// The highest counter ever committed, kept beside the file.
    mark: fencegate_durable::Mark,
    created: bool,
    /// Held while the service runs (`fencegate restore-db` checks it).
    _claim: fencegate_durable::Claim,
}

impl Drop for Store {
    fn drop(&mut self) {
        // A file replaced since the last write (and never written since)
        // is caught here, before the close would checkpoint into it.
        if (self.watch.lost().is_some() || self.watch.check().is_err())
            && let Ok(stand_in) = Connection::open_in_memory()
        {
            std::mem::forget(std::mem::replace(&mut self.conn, stand_in));
        }
    }
}

/// One lock's row to write in a commit.
#[derive(Debug, Clone)]
pub enum LeaseRow {
    Put(Lease),
    Delete(LockName),
}

/// How durable a commit must be before its answers go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync'd: the commit issues a token.
    Fsync,
    /// Written to the OS only: survives a process crash, not a power loss.
    Written,
}

impl Store {
    /// Opens the database at `path`, creating it only as `opening` allows
    /// (a new one's counter starts at `floor`; an existing one's is raised
    /// to it), and checks that it can be written.
    pub fn open(path: &Path, opening: Opening, floor: u64) -> anyhow::Result<Store> {
        let opened = fencegate_durable::open(path, opening, KIND, floor, |conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS counter (
                     id INTEGER PRIMARY KEY CHECK (id = 1),
                     last_token INTEGER NOT NULL
                 );
                 INSERT OR IGNORE INTO counter (id, last_token) VALUES (1, 0);
                 CREATE TABLE IF NOT EXISTS leases (
                     lock TEXT PRIMARY KEY,
                     owner TEXT NOT NULL,
                     token INTEGER NOT NULL,
                     expires_at_ms INTEGER NOT NULL,
                     idempotency_sha256 BLOB
                 );",
            )?;
            // Databases written before idempotency keys existed lack the
            // column; their leases have no key (nobody can re-acquire them
            // while live).
            let has_key_column: bool = conn
                .prepare(
                    "SELECT 1 FROM pragma_table_info('leases') WHERE name = 'idempotency_sha256'",
                )?
                .exists([])?;
            if !has_key_column {
                conn.execute_batch("ALTER TABLE leases ADD COLUMN idempotency_sha256 BLOB")?;
            }
            Ok(())
        })?;
        Ok(Store {
            conn: opened.conn,
            watch: opened.watch,
            mark: opened.mark,
            created: opened.created,
            _claim: opened.claim,
        })
    }

    /// Whether this open created the file.
    pub fn created(&self) -> bool {
        self.created
    }

    /// Why the file was given up, if it was (see `fencegate_durable::Watch`).
    pub fn lost(&self) -> Option<&str> {
        self.watch.lost()
    }

    /// The last token issued and every recorded lease.
    pub fn load(&self) -> anyhow::Result<(u64, Vec<Lease>)> {
        let counter: i64 = self
            .conn
            .query_row("SELECT last_token FROM counter WHERE id = 1", [], |r| {
                r.get(0)
            })
            .optional()?
            .unwrap_or(0);
        let mut stmt = self
            .conn
            .prepare("SELECT lock, owner, token, expires_at_ms, idempotency_sha256 FROM leases")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, Option<Vec<u8>>>(4)?,
            ))
        })?;
        let mut leases = Vec::new();
        for row in rows {
            let (lock, owner, token, expires, key) = row?;
            let lock = LockName::new(&lock)
                .map_err(|e| anyhow::anyhow!("lease database holds a bad lock name: {e}"))?;
            let idempotency = match key {
                None => None,
                Some(bytes) => Some(KeyDigest::from_bytes(bytes.try_into().map_err(|_| {
                    anyhow::anyhow!("lease database holds a bad idempotency digest for lock {lock}")
                })?)),
            };
            leases.push(Lease {
                lock,
                owner,
                token: from_sql(token),
                expires_at: Timestamp(from_sql(expires)),
                idempotency,
            });
        }
        Ok((from_sql(counter), leases))
    }

    /// Writes the counter and `rows` in one transaction with `durability`.
    pub fn commit(
        &mut self,
        counter: u64,
        rows: &[LeaseRow],
        durability: Durability,
    ) -> rusqlite::Result<()> {
        self.watch.check().map_err(|why| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(why),
            )
        })?;
        let sync = match durability {
            Durability::Fsync => "FULL",
            Durability::Written => "NORMAL",
        };
        self.conn.pragma_update(None, "synchronous", sync)?;
        self.write(counter, rows)?;
        self.watch.written();
        // Before any answer the commit allows goes out.
        self.mark.record(fencegate_durable::Level {
            generation: counter,
            token: counter,
        })
    }

    fn write(&mut self, counter: u64, rows: &[LeaseRow]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        // The counter only moves up: MAX() guards against a caller bug ever
        // writing a lower value.
        tx.execute(
            "UPDATE counter SET last_token = MAX(last_token, ?1) WHERE id = 1",
            params![to_sql(counter)],
        )?;
        for row in rows {
            match row {
                LeaseRow::Put(l) => {
                    tx.execute(
                        "INSERT INTO leases (lock, owner, token, expires_at_ms, idempotency_sha256)
                         VALUES (?1, ?2, ?3, ?4, ?5)
                         ON CONFLICT(lock) DO UPDATE
                         SET owner = ?2, token = ?3, expires_at_ms = ?4, idempotency_sha256 = ?5",
                        params![
                            l.lock.as_str(),
                            l.owner,
                            to_sql(l.token),
                            to_sql(l.expires_at.as_millis()),
                            l.idempotency.as_ref().map(|d| d.as_bytes().as_slice())
                        ],
                    )?;
                }
                LeaseRow::Delete(lock) => {
                    tx.execute("DELETE FROM leases WHERE lock = ?1", params![lock.as_str()])?;
                }
            }
        }
        tx.commit()
    }
}

/// SQLite integers are i64; tokens and times never reach 2^63 in practice,
/// and saturating keeps order if they did.
fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_and_leases_round_trip_and_counter_never_lowers() {
        let (_dir, path) = fencegate_testkit::temp_path("l.db");
        let lease = Lease {
            lock: LockName::new("x").expect("valid"),
            owner: "A".into(),
            token: 4,
            expires_at: Timestamp(1234),
            idempotency: Some(KeyDigest::of(b"client-secret-0123456789")),
        };
        {
            let mut s = Store::open(&path, Opening::CreateIfMissing, 0).expect("open");
            s.commit(4, &[LeaseRow::Put(lease.clone())], Durability::Fsync)
                .expect("commit");
            s.commit(2, &[], Durability::Written).expect("commit");
        }
        let s = Store::open(&path, Opening::CreateIfMissing, 0).expect("reopen");
        let (counter, leases) = s.load().expect("load");
        assert_eq!(counter, 4);
        assert_eq!(leases, vec![lease]);
    }

    #[test]
    fn a_database_without_the_key_column_is_upgraded() {
        let (_dir, path) = fencegate_testkit::temp_path("old.db");
        {
            let conn = Connection::open(&path).expect("open");
            conn.execute_batch(
                "CREATE TABLE counter (id INTEGER PRIMARY KEY CHECK (id = 1), last_token INTEGER NOT NULL);
                 INSERT INTO counter VALUES (1, 9);
                 CREATE TABLE leases (lock TEXT PRIMARY KEY, owner TEXT NOT NULL,
                                      token INTEGER NOT NULL, expires_at_ms INTEGER NOT NULL);
                 INSERT INTO leases VALUES ('x', 'A', 9, 5000);",
            )
            .expect("old schema");
        }
        let s = Store::open(&path, Opening::CreateIfMissing, 0).expect("upgrades");
        let (counter, leases) = s.load().expect("load");
        assert_eq!(counter, 9);
        assert_eq!(leases.len(), 1);
        assert_eq!((leases[0].token, leases[0].idempotency), (9, None));
    }
}
