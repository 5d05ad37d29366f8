//! The schedule cache: one SQLite file, one row per launch key with the winning variant.
//!
//! The file says it is ours by its `application_id` and its schema by `user_version`. It runs
//! in WAL mode with a busy timeout, so that several processes may tune at once. A file that is
//! not a database, another program's database, or one of another schema version is moved
//! aside (`<name>.bad-<unix seconds>`) with a warning and a fresh one is made: a cache is
//! never worth a crash.

use crate::{Error, Result};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `application_id` of a Tessera schedule cache: "TSRA".
const APP_ID: i32 = 0x5453_5241;
/// The schema below; a file of another version is rebuilt.
pub const SCHEMA_VERSION: i32 = 1;
/// How long a writer waits for another process's lock before giving up on one attempt.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS schedules (
    key        TEXT PRIMARY KEY,
    op         TEXT NOT NULL,
    choice     TEXT NOT NULL,
    best_us    REAL NOT NULL,
    default_us REAL,
    launches   INTEGER NOT NULL,
    strategy   TEXT NOT NULL,
    created_at INTEGER NOT NULL
);";

/// One cached decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The launch key ([`crate::tune::TuneKey`]).
    pub key: String,
    /// The operation (`gemm`, `attention`).
    pub op: String,
    /// The winning candidate's name (a kernel variant's entry name).
    pub choice: String,
    /// Its microseconds per launch when it was chosen.
    pub best_us: f64,
    /// The default candidate's microseconds per launch in the same search, if it was timed.
    pub default_us: Option<f64>,
    /// Launches the search made.
    pub launches: u64,
    /// The search strategy.
    pub strategy: String,
}

/// An open schedule cache.
pub struct Cache {
    conn: Connection,
    path: PathBuf,
}

/// Why a file cannot be used as it is.
enum Unfit {
    /// Not ours, corrupt, or another schema: move it aside.
    Replace(String),
    /// Another connection held a lock that SQLite would not wait for (switching a fresh file
    /// to WAL while others open it too answers "database is locked" at once): try again.
    Busy(String),
    /// SQLite itself failed (no such directory, permissions): give up on the file.
    Fail(String),
}

fn sql_err(e: rusqlite::Error) -> Unfit {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => Unfit::Replace(e.to_string()),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => Unfit::Busy(e.to_string()),
        _ => Unfit::Fail(e.to_string()),
    }
}

impl Cache {
    /// Opens (or makes) the cache at `path`; a file that cannot be used is moved aside with a
    /// warning on stderr and replaced.
    ///
    /// # Errors
    /// [`Error::Cache`] only when no cache can be made there at all (an unwritable folder).
    pub fn open(path: &Path) -> Result<Cache> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| cache_err(path, "a folder that can be made", e.to_string()))?;
        }
        match Cache::open_waiting(path) {
            Ok(c) => Ok(c),
            Err(Unfit::Fail(why) | Unfit::Busy(why)) => Err(cache_err(path, "a file SQLite can open", why)),
            Err(Unfit::Replace(why)) => {
                let aside = move_aside(path)?;
                eprintln!(
                    "tessera: warning: the schedule cache {} was unusable ({why}); moved it to {} and made a new one",
                    path.display(),
                    aside.display()
                );
                Cache::open_waiting(path).map_err(|u| match u {
                    Unfit::Fail(w) | Unfit::Replace(w) | Unfit::Busy(w) => cache_err(path, "a fresh cache", w),
                })
            }
        }
    }

    /// Opens an existing cache without repairing it (for import).
    ///
    /// # Errors
    /// [`Error::Cache`] if the file is missing, not a Tessera cache, or of another schema.
    pub fn open_existing(path: &Path) -> Result<Cache> {
        if !path.is_file() {
            return Err(cache_err(path, "an existing cache file", "no such file".into()));
        }
        Cache::open_waiting(path).map_err(|u| match u {
            Unfit::Fail(w) | Unfit::Replace(w) | Unfit::Busy(w) => cache_err(path, "a Tessera schedule cache", w),
        })
    }

    /// [`Cache::try_open`] again while another process or thread holds a lock SQLite would not
    /// wait for, up to the busy timeout (the tuner test's eight writers opening one fresh file
    /// met it once in CI).
    fn open_waiting(path: &Path) -> std::result::Result<Cache, Unfit> {
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match Cache::try_open(path) {
                Err(Unfit::Busy(_)) if start.elapsed() < BUSY_TIMEOUT => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    fn try_open(path: &Path) -> std::result::Result<Cache, Unfit> {
        let conn = Connection::open(path).map_err(sql_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(sql_err)?;
        // Reading the header is the first touch of the file: garbage fails here.
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0)).map_err(sql_err)?;
        let _ = mode;
        let mut cache = Cache { conn, path: path.to_path_buf() };
        cache.check_or_create()?;
        Ok(cache)
    }

    /// A fresh file gets the schema; ours is checked; anything else is unfit.
    fn check_or_create(&mut self) -> std::result::Result<(), Unfit> {
        let tx = self.conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(sql_err)?;
        let app: i32 = tx.query_row("PRAGMA application_id", [], |r| r.get(0)).map_err(sql_err)?;
        let version: i32 = tx.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sql_err)?;
        let tables: i64 = tx.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0)).map_err(sql_err)?;
        if app == 0 && version == 0 && tables == 0 {
            tx.execute_batch(SCHEMA).map_err(sql_err)?;
            tx.execute_batch(&format!("PRAGMA application_id = {APP_ID}; PRAGMA user_version = {SCHEMA_VERSION};")).map_err(sql_err)?;
            tx.commit().map_err(sql_err)?;
            return Ok(());
        }
        if app != APP_ID {
            return Err(Unfit::Replace(format!("application_id {app:#x}, not a Tessera schedule cache")));
        }
        if version != SCHEMA_VERSION {
            return Err(Unfit::Replace(format!("schema version {version}, this build reads {SCHEMA_VERSION}")));
        }
        let ok: String = tx.query_row("PRAGMA quick_check", [], |r| r.get(0)).map_err(sql_err)?;
        if ok != "ok" {
            return Err(Unfit::Replace(format!("integrity check: {ok}")));
        }
        tx.commit().map_err(sql_err)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry for `key`, if any.
    ///
    /// # Errors
    /// [`Error::Cache`] when SQLite fails.
    pub fn get(&self, key: &str) -> Result<Option<Entry>> {
        self.conn
            .query_row("SELECT key, op, choice, best_us, default_us, launches, strategy FROM schedules WHERE key = ?1", [key], row_entry)
            .optional()
            .map_err(|e| self.err("a readable cache", e))
    }

    /// Writes `entry`; of two processes tuning the same key, the faster result stays.
    ///
    /// # Errors
    /// [`Error::Cache`] when SQLite fails after its busy retries.
    pub fn put(&self, e: &Entry) -> Result<()> {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let mut tries = 0;
        loop {
            let r = self.conn.execute(
                "INSERT INTO schedules (key, op, choice, best_us, default_us, launches, strategy, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
                 ON CONFLICT(key) DO UPDATE SET
                    op = excluded.op, choice = excluded.choice, best_us = excluded.best_us,
                    default_us = excluded.default_us, launches = excluded.launches,
                    strategy = excluded.strategy, created_at = excluded.created_at
                 WHERE excluded.best_us < schedules.best_us",
                params![e.key, e.op, e.choice, e.best_us, e.default_us, e.launches as i64, e.strategy, now],
            );
            match r {
                Ok(_) => return Ok(()),
                // The busy timeout already waited; a few more tries cover a lock that another
                // writer kept through a checkpoint.
                Err(err) if tries < 5 && err.sqlite_error_code() == Some(rusqlite::ErrorCode::DatabaseBusy) => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20 << tries));
                }
                Err(err) => return Err(self.err("a writable cache", err)),
            }
        }
    }

    /// Every entry, by key.
    ///
    /// # Errors
    /// [`Error::Cache`] when SQLite fails.
    pub fn entries(&self) -> Result<Vec<Entry>> {
        let mut st = self
            .conn
            .prepare("SELECT key, op, choice, best_us, default_us, launches, strategy FROM schedules ORDER BY key")
            .map_err(|e| self.err("a readable cache", e))?;
        let rows = st.query_map([], row_entry).map_err(|e| self.err("a readable cache", e))?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(|e| self.err("a readable cache", e))
    }

    /// Writes a copy of the whole cache to `to` (replacing a file there).
    ///
    /// # Errors
    /// [`Error::Cache`] if `to` cannot be written.
    pub fn export(&self, to: &Path) -> Result<()> {
        if to.exists() {
            std::fs::remove_file(to).map_err(|e| cache_err(to, "a path that can be replaced", e.to_string()))?;
        }
        let to_str = to.to_str().ok_or_else(|| cache_err(to, "a UTF-8 path", to.display().to_string()))?;
        self.conn.execute("VACUUM INTO ?1", [to_str]).map_err(|e| cache_err(to, "a path that can be written", e.to_string()))?;
        Ok(())
    }

    /// Adds every entry of the cache file `from` (a faster result for a key already here
    /// wins). Gives the number of entries read.
    ///
    /// # Errors
    /// [`Error::Cache`] if `from` is not a Tessera schedule cache of this schema.
    pub fn import(&self, from: &Path) -> Result<usize> {
        let other = Cache::open_existing(from)?;
        let entries = other.entries()?;
        for e in &entries {
            self.put(e)?;
        }
        Ok(entries.len())
    }

    fn err(&self, expected: &str, e: rusqlite::Error) -> Error {
        cache_err(&self.path, expected, e.to_string())
    }
}

fn row_entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    Ok(Entry {
        key: r.get(0)?,
        op: r.get(1)?,
        choice: r.get(2)?,
        best_us: r.get(3)?,
        default_us: r.get(4)?,
        launches: r.get::<_, i64>(5)?.max(0) as u64,
        strategy: r.get(6)?,
    })
}

fn cache_err(path: &Path, expected: &str, found: String) -> Error {
    Error::Cache { path: path.display().to_string(), expected: expected.into(), found }
}

/// Renames `path` (and its WAL and shared-memory files) to `<path>.bad-<unix seconds>`.
fn move_aside(path: &Path) -> Result<PathBuf> {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut aside = PathBuf::from(format!("{}.bad-{stamp}", path.display()));
    let mut n = 1;
    while aside.exists() {
        aside = PathBuf::from(format!("{}.bad-{stamp}-{n}", path.display()));
        n += 1;
    }
    std::fs::rename(path, &aside).map_err(|e| cache_err(path, "a file that can be moved aside", e.to_string()))?;
    for ext in ["-wal", "-shm"] {
        let side = PathBuf::from(format!("{}{ext}", path.display()));
        if side.exists() {
            let _ = std::fs::rename(&side, PathBuf::from(format!("{}{ext}", aside.display())));
        }
    }
    Ok(aside)
}
