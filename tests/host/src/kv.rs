//! Spin's key-value store (`fermyon:spin/key-value@2.0.0`) as `spin up` gives it without a
//! runtime configuration: one store, `default`, shared by every component of the app that
//! lists it in `key_value_stores`. A component that does not list it is refused
//! (`access-denied`), any other label is `no-such-store`, and the manifest is refused at load
//! time if it names another label (as Spin refuses it). Keys are at most 256 bytes and values
//! 1 MiB, as Spin documents. Spin keeps the store in `.spin/sqlite_key_value.db`; the host keeps
//! it in memory for its lifetime.
//!
//! Tests can make the store fail ([`Kv::set_failing`]: every operation answers `other`) and
//! see each invocation's operations in its record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use wasmtime::component::Resource;

use crate::bindings::fermyon::spin::key_value::{self, Error};
use crate::State;

/// The longest key Spin takes.
pub const MAX_KEY_BYTES: usize = 256;
/// The largest value Spin takes.
pub const MAX_VALUE_BYTES: usize = 1 << 20;

/// The host's `default` store.
#[derive(Debug, Default)]
pub struct Kv {
    data: Mutex<HashMap<String, Vec<u8>>>,
    failing: AtomicBool,
}

impl Kv {
    /// Makes every operation fail (`other`), or work again.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// A copy of the store's content.
    pub fn snapshot(&self) -> HashMap<String, Vec<u8>> {
        self.data.lock().map(|d| d.clone()).unwrap_or_default()
    }

    fn check(&self) -> Result<(), Error> {
        if self.failing.load(Ordering::SeqCst) {
            Err(Error::Other("injected key-value failure".into()))
        } else {
            Ok(())
        }
    }
}

/// An open store (the resource's host side).
pub struct KvStore;

/// What one invocation may open, and where its operations are recorded.
pub struct KvAccess {
    /// The store.
    pub kv: Arc<Kv>,
    /// Labels the component lists in `key_value_stores`.
    pub allowed: Arc<Vec<String>>,
    /// Operations so far (`get`, `set`, `delete`, ...).
    pub ops: Arc<Mutex<Vec<String>>>,
}

impl State {
    fn kv_op(&self, op: &str) -> Result<(), Error> {
        if let Ok(mut ops) = self.kv.ops.lock() {
            ops.push(op.to_string());
        }
        self.kv.kv.check()
    }

    fn with_data<R>(&self, f: impl FnOnce(&mut HashMap<String, Vec<u8>>) -> R) -> Result<R, Error> {
        let mut data = self
            .kv
            .kv
            .data
            .lock()
            .map_err(|_| Error::Other("the store is unusable".into()))?;
        Ok(f(&mut data))
    }
}

fn check_key(key: &str) -> Result<(), Error> {
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::Other(format!(
            "keys are at most {MAX_KEY_BYTES} bytes"
        )));
    }
    Ok(())
}

impl key_value::Host for State {}

impl key_value::HostStore for State {
    fn open(&mut self, label: String) -> Result<Resource<KvStore>, Error> {
        self.kv_op("open")?;
        if label != "default" {
            return Err(Error::NoSuchStore);
        }
        if !self.kv.allowed.contains(&label) {
            return Err(Error::AccessDenied);
        }
        self.table.push(KvStore).map_err(|_| Error::StoreTableFull)
    }

    fn get(&mut self, _store: Resource<KvStore>, key: String) -> Result<Option<Vec<u8>>, Error> {
        self.kv_op("get")?;
        check_key(&key)?;
        self.with_data(|d| d.get(&key).cloned())
    }

    fn set(&mut self, _store: Resource<KvStore>, key: String, value: Vec<u8>) -> Result<(), Error> {
        self.kv_op("set")?;
        check_key(&key)?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(Error::Other(format!(
                "values are at most {MAX_VALUE_BYTES} bytes"
            )));
        }
        self.with_data(|d| {
            d.insert(key, value);
        })
    }

    fn delete(&mut self, _store: Resource<KvStore>, key: String) -> Result<(), Error> {
        self.kv_op("delete")?;
        check_key(&key)?;
        self.with_data(|d| {
            d.remove(&key);
        })
    }

    fn exists(&mut self, _store: Resource<KvStore>, key: String) -> Result<bool, Error> {
        self.kv_op("exists")?;
        check_key(&key)?;
        self.with_data(|d| d.contains_key(&key))
    }

    fn get_keys(&mut self, _store: Resource<KvStore>) -> Result<Vec<String>, Error> {
        self.kv_op("get-keys")?;
        self.with_data(|d| d.keys().cloned().collect())
    }

    fn drop(&mut self, store: Resource<KvStore>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}
