//! The in-memory store (`memory:`). Baseline: a compare-and-set on a
//! `Mutex<HashMap>` entry, the least an in-memory lease table must do. No
//! peer; no other process can see it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::{cas_lost, Baseline, Bench, Entry, Opened, Register, Settings};
use crate::Result;

/// The memory store's entry.
pub const ENTRY: Entry = Entry {
    name: "memory",
    scheme: "memory",
    connect: Ok(connect),
};

fn connect(_settings: &Settings) -> BoxFuture<'_, Result<Arc<dyn Bench>>> {
    Box::pin(async { Ok(Arc::new(Memory) as Arc<dyn Bench>) })
}

struct Memory;

#[async_trait]
impl Bench for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn shown_url(&self) -> String {
        "memory:".to_string()
    }

    async fn server(&self) -> Option<String> {
        None
    }

    async fn open(&self, _tag: &str) -> Result<Opened> {
        let url = "memory:".to_string();
        Ok(Opened {
            store: worklease::store::url::open(&url)?,
            url,
            peer: None,
            baseline: Arc::new(Table::default()),
        })
    }

    fn shared_across_processes(&self) -> bool {
        false
    }

    async fn cleanup(&self) -> Result<()> {
        Ok(())
    }
}

/// The baseline's table: version and data per register.
#[derive(Default)]
struct Table {
    rows: Arc<Mutex<HashMap<u64, (u64, Bytes)>>>,
    next: AtomicU64,
}

#[async_trait]
impl Baseline for Table {
    fn describe(&self) -> String {
        "compare-and-set of one entry of a Mutex<HashMap> (version, bytes)".to_string()
    }

    async fn register(&self) -> Result<Box<dyn Register>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.rows
            .lock()
            .map_err(|_| "poisoned")?
            .insert(id, (0, Bytes::new()));
        Ok(Box::new(Row {
            rows: self.rows.clone(),
            id,
            version: 0,
        }))
    }
}

struct Row {
    rows: Arc<Mutex<HashMap<u64, (u64, Bytes)>>>,
    id: u64,
    version: u64,
}

#[async_trait]
impl Register for Row {
    async fn cas(&mut self, data: &Bytes) -> Result<()> {
        let mut rows = self.rows.lock().map_err(|_| "poisoned")?;
        let row = rows.get_mut(&self.id).ok_or("no such register")?;
        if row.0 != self.version {
            return Err(cas_lost("a memory entry"));
        }
        self.version += 1;
        *row = (self.version, data.clone());
        Ok(())
    }
}
