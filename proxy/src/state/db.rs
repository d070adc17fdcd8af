//! The proxy's durable state in SQLite (WAL, `synchronous=FULL`):
//! max_token per fence scope, and the token bound to each multipart upload.
//!
//! Both are written before the decision they record is acted on: a higher
//! max is fsync'd before the write carrying it is forwarded, and an upload's
//! binding before its upload id is returned to the client. A restart reads
//! them back, so it never forgets a max and never unfences an upload.
//!
//! It also records whether the last run of the process ended cleanly
//! (every request drained, no write left that the store may still
//! commit): a run that did not may have left writes in flight, and the
//! next one must wait them out before it raises a fence (`fences`).
//!
//! The file is `fencegate_durable`'s to guard: created only when told (a
//! new one can start every lock's max at a floor), refused when it is not
//! a proxy database or is below its high-water mark (a lost `-wal`, an
//! older copy; every raise is counted and raises the mark), probed for a read-only
//! disk before the proxy listens, claimed while the proxy runs, and
//! watched before every write for being deleted, replaced or written by
//! someone else (then every write fails, and the proxy is not ready).

use crate::state_error::StateError;
use crate::tokens::upload::UploadBinding;
use fencegate_durable::{Claim, Opening, Watch};
use parking_lot::Mutex;
use rusqlite::{Connection, OptionalExtension, params};
use std::path::Path;
use std::sync::Arc;

/// What the file is called in messages.
const KIND: fencegate_durable::Kind = fencegate_durable::Kind::Proxy;
const WHAT: &str = KIND.what();

/// Handle to the database; cheap to clone. Calls block: run them from
/// `spawn_blocking` (they are rare: a new max, a new upload).
#[derive(Debug, Clone)]
pub struct Db {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    /// Not closed when the file was lost: a close would checkpoint the
    /// log into whatever file now has the name.
    conn: Connection,
    watch: Watch,
    /// How far the raises went, kept beside the file.
    mark: fencegate_durable::Mark,
    _claim: Claim,
    /// Why the last write failed, if it did (readiness).
    failed: Option<String>,
    /// Its path, to see it deleted while nothing is written.
    path: std::path::PathBuf,
}

impl Drop for Inner {
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

fn to_sql(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_sql(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Db {
    /// Opens the database at `path`, creating it only as `opening` allows;
    /// `floor` (if above 0) becomes the least max of every lock, the ones
    /// it never saw included.
    pub fn open(path: &Path, opening: Opening, floor: u64) -> anyhow::Result<Db> {
        let opened = fencegate_durable::open(path, opening, KIND, floor, |conn| {
            conn.execute_batch(
                "CREATE TABLE IF NOT EXISTS fences (
                     scope TEXT PRIMARY KEY,
                     max_token INTEGER NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS runs (
                     id INTEGER PRIMARY KEY CHECK (id = 1),
                     clean INTEGER NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS meta (
                     name TEXT PRIMARY KEY,
                     value INTEGER NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS uploads (
                     upload_id TEXT PRIMARY KEY,
                     bucket TEXT NOT NULL,
                     key TEXT NOT NULL,
                     scope TEXT NOT NULL,
                     token INTEGER NOT NULL
                 );",
            )?;
            // Uploads bound before identities were recorded have owner '':
            // only a request presenting the bound token may continue them.
            let has_owner = conn
                .prepare("SELECT 1 FROM pragma_table_info('uploads') WHERE name = 'owner'")?
                .exists([])?;
            if !has_owner {
                conn.execute_batch(
                    "ALTER TABLE uploads ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
                )?;
            }
            Ok(())
        })?;
        if opened.created {
            tracing::warn!(
                db = %path.display(),
                floor,
                "created a new proxy database (--create-db): every lock's max starts at the floor"
            );
        }
        Ok(Db {
            inner: Arc::new(Mutex::new(Inner {
                conn: opened.conn,
                watch: opened.watch,
                mark: opened.mark,
                _claim: opened.claim,
                failed: None,
                path: path.to_owned(),
            })),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic mid-call; the connection itself is
        // still consistent (SQLite transactions), so keep using it.
        self.inner.lock()
    }

    /// A read.
    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        f(&self.lock().conn)
    }

    /// A write: only to the file the proxy opened, as it left it.
    fn write<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        let mut inner = self.lock();
        inner.watch.check().map_err(|why| {
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
                Some(why),
            )
        })?;
        let r = f(&inner.conn);
        match &r {
            Ok(_) => {
                inner.watch.written();
                inner.failed = None;
            }
            Err(e) => inner.failed = Some(e.to_string()),
        }
        r
    }

    /// Why the proxy cannot persist a raise now, if it cannot: the file
    /// was given up or is gone, the last write failed, or (`raises_here`:
    /// raises are written to this file) its disk is full (readiness).
    pub fn problem(&self, raises_here: bool) -> Option<String> {
        // After a failed write, a probe: readiness comes back with the
        // disk even if no raise is asked for (a load balancer sends none
        // to a proxy it took out).
        if self.lock().failed.is_some() {
            let _ = self.write(|c| {
                c.execute(
                    "INSERT INTO meta (name, value) VALUES ('ready_probe', 1)
                     ON CONFLICT (name) DO UPDATE SET value = value + 1",
                    [],
                )
                .map(drop)
            });
        }
        let inner = self.lock();
        if let Some(why) = inner.watch.lost() {
            return Some(why.to_owned());
        }
        // A full disk refuses every raise; an empty probe above does not
        // see it.
        if raises_here && let Some(why) = fencegate_durable::space_problem(&inner.path, WHAT) {
            return Some(why);
        }
        if !inner.path.exists() {
            return Some(format!(
                "the proxy database {} is gone: the next raise will fail",
                inner.path.display()
            ));
        }
        inner
            .failed
            .as_ref()
            .map(|e| format!("the last write to the proxy database failed: {e}"))
    }

    /// The least max of every lock (`--token-floor`; 0 if none was set).
    pub fn floor(&self) -> rusqlite::Result<u64> {
        self.with(|c| {
            c.query_row("SELECT value FROM meta WHERE name = 'floor'", [], |r| {
                r.get::<_, i64>(0)
            })
            .optional()
            .map(|v| v.map_or(0, from_sql))
        })
    }

    /// Starts a run: whether the last one ended cleanly (a database no run
    /// has used yet: yes), and this one recorded, durably, as not (yet)
    /// ended cleanly.
    pub fn begin_run(&self) -> rusqlite::Result<bool> {
        self.write(|c| {
            let clean = c
                .query_row("SELECT clean FROM runs WHERE id = 1", [], |r| {
                    r.get::<_, i64>(0)
                })
                .optional()?
                .is_none_or(|clean| clean != 0);
            c.execute(
                "INSERT INTO runs (id, clean) VALUES (1, 0)
                 ON CONFLICT (id) DO UPDATE SET clean = 0",
                [],
            )?;
            Ok(clean)
        })
    }

    /// Records that this run ended cleanly.
    pub fn end_run_cleanly(&self) -> rusqlite::Result<()> {
        self.write(|c| {
            c.execute("UPDATE runs SET clean = 1 WHERE id = 1", [])
                .map(drop)
        })
    }

    /// Every scope's max_token.
    pub fn load_fences(&self) -> rusqlite::Result<Vec<(String, u64)>> {
        self.with(|c| {
            let mut stmt = c.prepare("SELECT scope, max_token FROM fences")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, from_sql(r.get(1)?))))?;
            rows.collect()
        })
    }

    /// Raises `scope`'s max to `token` (never lowers it), durably, and
    /// counts the raise; the high-water mark follows before it returns.
    pub fn raise(&self, scope: &str, token: u64) -> rusqlite::Result<()> {
        let generation = self.write(|c| {
            let tx = c.unchecked_transaction()?;
            tx.execute(
                "INSERT INTO fences (scope, max_token) VALUES (?1, ?2)
                 ON CONFLICT(scope) DO UPDATE SET max_token = MAX(max_token, ?2)",
                params![scope, to_sql(token)],
            )?;
            let generation: i64 = tx.query_row(
                "INSERT INTO meta (name, value) VALUES ('generation', 1)
                 ON CONFLICT (name) DO UPDATE SET value = value + 1
                 RETURNING value",
                [],
                |r| r.get(0),
            )?;
            tx.commit()?;
            Ok(from_sql(generation))
        })?;
        let mut inner = self.lock();
        let level = fencegate_durable::Level {
            generation,
            token: token.max(inner.mark.level().token),
        };
        let recorded = inner.mark.record(level);
        if let Err(e) = &recorded {
            inner.failed = Some(e.to_string());
        }
        recorded
    }

    pub fn bind_upload(&self, b: &UploadBinding) -> rusqlite::Result<()> {
        let b = b.record();
        self.write(|c| {
            c.execute(
                "INSERT OR REPLACE INTO uploads (upload_id, bucket, key, scope, token, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![b.upload_id, b.bucket, b.key, b.scope, to_sql(b.token), b.owner],
            )
            .map(|_| ())
        })
    }

    pub fn upload(&self, upload_id: &str) -> Result<Option<UploadBinding>, StateError> {
        let read = self.with(|c| {
            c.query_row(
                "SELECT upload_id, bucket, key, scope, token, owner FROM uploads WHERE upload_id = ?1",
                params![upload_id],
                UploadBinding::read_row,
            )
            .optional()
        })?;
        read.transpose()
    }

    pub fn forget_upload(&self, upload_id: &str) -> rusqlite::Result<()> {
        self.write(|c| {
            c.execute(
                "DELETE FROM uploads WHERE upload_id = ?1",
                params![upload_id],
            )
            .map(|_| ())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::upload::UploadRecord;

    #[test]
    fn max_never_lowers_and_survives_reopen() {
        let (_dir, path) = fencegate_testkit::temp_path("p.db");
        {
            let db = Db::open(&path, Opening::CreateIfMissing, 0).expect("open");
            db.raise("b", 5).expect("raise");
            db.raise("b", 3).expect("raise");
            let record = UploadRecord {
                upload_id: "u1".into(),
                bucket: "b".into(),
                key: "k".into(),
                scope: "b".into(),
                token: 5,
                owner: "key:k".into(),
            };
            db.bind_upload(&UploadBinding::for_tests(record))
                .expect("bind");
        }
        let db = Db::open(&path, Opening::CreateIfMissing, 0).expect("reopen");
        assert_eq!(db.load_fences().expect("load"), vec![("b".to_owned(), 5)]);
        assert_eq!(
            db.upload("u1").expect("read").map(|u| u.token().number()),
            Some(5)
        );
        db.forget_upload("u1").expect("forget");
        assert_eq!(db.upload("u1").expect("read"), None);
    }

    #[test]
    fn a_binding_in_no_form_the_proxy_writes_is_unreadable_not_absent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::open(&dir.path().join("p.db"), Opening::CreateIfMissing, 0).expect("open");
        db.write(|c| {
            c.execute(
                "INSERT INTO uploads (upload_id, bucket, key, scope, token, owner) VALUES ('u1', 'b', 'k', 'b', 5, 'someone')",
                [],
            )
        })
        .expect("insert");
        let got = db.upload("u1");
        assert!(
            matches!(&got, Err(StateError::Unreadable(why)) if why.contains("someone")),
            "{got:?}"
        );
    }

    #[tokio::test]
    async fn a_database_call_that_panics_is_a_state_error() {
        let got: Result<(), StateError> =
            crate::state_error::blocking(|| panic!("the disk went away")).await;
        assert!(matches!(got, Err(StateError::Task(_))), "{got:?}");
    }

    #[test]
    fn a_run_is_unclean_until_it_says_otherwise() {
        let (_dir, path) = fencegate_testkit::temp_path("p.db");
        let open = || Db::open(&path, Opening::CreateIfMissing, 0).expect("open");
        assert!(open().begin_run().expect("first"), "no run before");
        assert!(
            !open().begin_run().expect("after a crash"),
            "the run never ended"
        );
        let db = open();
        assert!(!db.begin_run().expect("again"));
        db.end_run_cleanly().expect("clean");
        assert!(open().begin_run().expect("after a clean stop"));
        assert!(!open().begin_run().expect("then a crash"));
    }
}
