//! A bounded pool of read-ahead buffers, and a `Read` over a channel of them.
//!
//! The archive is read by one thread, which fills buffers and sends them to whichever worker
//! extracts the current member. The pool caps how many buffers exist at once, so memory stays
//! bounded however far the reader gets ahead; a buffer goes back to the pool when dropped,
//! whichever way it is dropped (consumed, or discarded with a failed worker's channel).

use std::io::{self, Read};
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::Receiver;
use rn50_util::{lock_unpoisoned, unpoisoned};

pub struct Pool {
    state: Mutex<PoolState>,
    freed: Condvar,
    chunk: usize,
}

struct PoolState {
    free: Vec<Vec<u8>>,
    outstanding: usize,
    max: usize,
}

impl Pool {
    /// A pool of at most `buffers` buffers of `chunk` bytes each.
    pub fn new(buffers: usize, chunk: usize) -> Arc<Pool> {
        Arc::new(Pool {
            state: Mutex::new(PoolState {
                free: Vec::new(),
                outstanding: 0,
                max: buffers.max(1),
            }),
            freed: Condvar::new(),
            chunk: chunk.max(512),
        })
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// Takes a buffer, waiting until one is free.
    pub fn take(self: &Arc<Pool>) -> Chunk {
        let mut st = lock_unpoisoned(&self.state);
        while st.outstanding >= st.max {
            st = unpoisoned(self.freed.wait(st));
        }
        st.outstanding += 1;
        let buf = st.free.pop().unwrap_or_else(|| vec![0; self.chunk]);
        Chunk {
            buf,
            len: 0,
            pool: self.clone(),
        }
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut st = lock_unpoisoned(&self.state);
        st.outstanding -= 1;
        st.free.push(buf);
        drop(st);
        self.freed.notify_one();
    }
}

/// A pooled buffer holding `len` bytes of data.
pub struct Chunk {
    buf: Vec<u8>,
    len: usize,
    pool: Arc<Pool>,
}

impl Chunk {
    /// The whole buffer, to fill.
    pub fn space(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
    }
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// What the reader sends to a worker.
pub enum Msg {
    Data(Chunk),
    /// The member is complete.
    End,
}

/// Reads the bytes of one member as the reader sends them. If the reader stops without `End`
/// (it failed, or the run is being cancelled), reads fail.
pub struct ChunkReader {
    rx: Receiver<Msg>,
    cur: Option<Chunk>,
    off: usize,
    ended: bool,
    /// A read returned 0: whoever reads us hit the end of the member.
    pub hit_end: bool,
}

impl ChunkReader {
    pub fn new(rx: Receiver<Msg>) -> ChunkReader {
        ChunkReader {
            rx,
            cur: None,
            off: 0,
            ended: false,
            hit_end: false,
        }
    }

    /// Reads and discards whatever is left (tar padding), failing if the member is cut short.
    pub fn drain(&mut self) -> io::Result<u64> {
        let saved = self.hit_end;
        let n = io::copy(self, &mut io::sink())?;
        self.hit_end = saved;
        Ok(n)
    }
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            if let Some(c) = &self.cur {
                let data = &c.data()[self.off..];
                if !data.is_empty() {
                    let n = data.len().min(out.len());
                    out[..n].copy_from_slice(&data[..n]);
                    self.off += n;
                    return Ok(n);
                }
            }
            self.cur = None; // back to the pool before waiting for more
            if self.ended {
                self.hit_end = true;
                return Ok(0);
            }
            match self.rx.recv() {
                Ok(Msg::Data(c)) => {
                    self.cur = Some(c);
                    self.off = 0;
                }
                Ok(Msg::End) => self.ended = true,
                Err(_) => {
                    return Err(io::Error::other(
                        "reading the archive stopped before the end of this member",
                    ))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;

    #[test]
    fn pool_bounds_buffers_and_reader_reassembles_bytes() {
        let pool = Pool::new(2, 1000);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let (tx, rx) = unbounded();
        let sender = {
            let pool = pool.clone();
            let data = data.clone();
            std::thread::spawn(move || {
                for piece in data.chunks(1000) {
                    let mut c = pool.take(); // blocks while the reader holds two
                    c.space()[..piece.len()].copy_from_slice(piece);
                    c.set_len(piece.len());
                    tx.send(Msg::Data(c)).unwrap();
                    assert!(pool.state.lock().unwrap().outstanding <= 2);
                }
                tx.send(Msg::End).unwrap();
            })
        };
        let mut r = ChunkReader::new(rx);
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        sender.join().unwrap();
        assert_eq!(got, data);
        assert!(r.hit_end);
        assert_eq!(pool.state.lock().unwrap().outstanding, 0);
    }

    #[test]
    fn reader_that_stops_without_end_is_an_error_and_buffers_return() {
        let pool = Pool::new(4, 512);
        let (tx, rx) = unbounded();
        let mut c = pool.take();
        c.set_len(100);
        tx.send(Msg::Data(c)).unwrap();
        tx.send(Msg::Data(pool.take())).unwrap();
        drop(tx);
        let mut r = ChunkReader::new(rx);
        let mut buf = [0u8; 100];
        assert_eq!(r.read(&mut buf).unwrap(), 100);
        let err = r.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("stopped before the end"));
        drop(r);
        assert_eq!(pool.state.lock().unwrap().outstanding, 0);
    }
}
