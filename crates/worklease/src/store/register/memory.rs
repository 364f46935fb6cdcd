//! [`MemoryRegister`]: the reference [`Register`], in this process's memory.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;

use super::{Handle, Register, RegisterError};
use crate::error::{Result, StoreError};
use crate::limits::WorkId;

const MEMORY_KIND: &str = "memory-register";

#[derive(Default)]
struct MemoryValues {
    values: HashMap<WorkId, (Bytes, u64)>,
    version: u64,
    /// The fencing floor, one for the whole register.
    floor: u64,
}

/// A [`Register`] in this process's memory: the reference register, for
/// tests. Handles are a version counter shared by all keys (as text), so a
/// handle is never reused, not even after a delete. Tests can look at what
/// an adapter stored through the [`Register`] methods themselves. It keeps
/// one fencing floor for all keys ([`Register::raise_fencing_floor`]).
#[derive(Default)]
pub struct MemoryRegister {
    state: Mutex<MemoryValues>,
}

impl std::fmt::Debug for MemoryRegister {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegister").finish_non_exhaustive()
    }
}

impl MemoryRegister {
    /// An empty register.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<MutexGuard<'_, MemoryValues>, RegisterError> {
        self.state.lock().map_err(|_| {
            StoreError::new(MEMORY_KIND, "state lock poisoned by an earlier panic").into()
        })
    }
}

#[async_trait]
impl Register for MemoryRegister {
    fn kind(&self) -> &'static str {
        MEMORY_KIND
    }

    async fn read(&self, key: &WorkId) -> Result<Option<(Bytes, Handle)>, RegisterError> {
        let st = self.lock()?;
        Ok(st
            .values
            .get(key)
            .map(|(v, n)| (v.clone(), Handle(n.to_string()))))
    }

    async fn write(
        &self,
        key: &WorkId,
        previous: Option<&Handle>,
        value: Bytes,
    ) -> Result<Handle, RegisterError> {
        let mut st = self.lock()?;
        let current = st.values.get(key).map(|(_, n)| Handle(n.to_string()));
        if current.as_ref() != previous {
            return Err(RegisterError::Conflict);
        }
        st.version += 1;
        let version = st.version;
        st.values.insert(key.clone(), (value, version));
        Ok(Handle(version.to_string()))
    }

    async fn delete(&self, key: &WorkId, handle: &Handle) -> Result<(), RegisterError> {
        let mut st = self.lock()?;
        match st.values.get(key) {
            Some((_, n)) if n.to_string() == handle.0 => {
                st.values.remove(key);
                Ok(())
            }
            _ => Err(RegisterError::Conflict),
        }
    }

    async fn list(&self) -> Result<Vec<WorkId>, RegisterError> {
        Ok(self.lock()?.values.keys().cloned().collect())
    }

    async fn fencing_floor(&self, _key: &WorkId) -> Result<u64, RegisterError> {
        Ok(self.lock()?.floor)
    }

    async fn raise_fencing_floor(
        &self,
        _key: &WorkId,
        fencing_token: u64,
    ) -> Result<bool, RegisterError> {
        let mut st = self.lock()?;
        st.floor = st.floor.max(fencing_token);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_register_compares_and_swaps() {
        let reg = MemoryRegister::new();
        let k = WorkId::new("k").unwrap();
        let h1 = reg.write(&k, None, Bytes::from_static(b"1")).await.unwrap();
        assert!(matches!(
            reg.write(&k, None, Bytes::new()).await,
            Err(RegisterError::Conflict)
        ));
        let h2 = reg
            .write(&k, Some(&h1), Bytes::from_static(b"2"))
            .await
            .unwrap();
        assert_ne!(h1, h2);
        assert!(matches!(
            reg.write(&k, Some(&h1), Bytes::new()).await,
            Err(RegisterError::Conflict)
        ));
        assert!(matches!(
            reg.delete(&k, &h1).await,
            Err(RegisterError::Conflict)
        ));
        assert_eq!(
            reg.read(&k).await.unwrap(),
            Some((Bytes::from_static(b"2"), h2.clone()))
        );
        reg.delete(&k, &h2).await.unwrap();
        assert_eq!(reg.read(&k).await.unwrap(), None);
        assert!(reg.list().await.unwrap().is_empty());
    }
}
