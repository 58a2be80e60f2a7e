//! Mutexes whose data stays usable after a panic: a thread that panicked while holding the lock poisons it, and
//! rn50's shared state (a process group handle, a buffer of samples or log records, a test's turn) is still
//! whole after such a panic, so every lock in rn50 takes the data as it is instead of passing the panic on.
use std::sync::{LockResult, Mutex, MutexGuard, PoisonError};

/// `m.lock()`, poisoned or not.
pub fn lock_unpoisoned<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    unpoisoned(m.lock())
}

/// The guard of a lock or condition-variable wait (`Condvar::wait_timeout_while`…), poisoned or not.
pub fn unpoisoned<G>(r: LockResult<G>) -> G {
    r.unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_while_holding_the_lock_leaves_the_data_usable() {
        let m = Mutex::new(vec![1]);
        let _ = std::panic::catch_unwind(|| {
            let mut v = m.lock().unwrap();
            v.push(2);
            panic!("while holding the lock");
        });
        assert!(m.is_poisoned());
        assert_eq!(*lock_unpoisoned(&m), [1, 2]);
    }
}
