//! Log lines on stderr in one format, through `tracing`: a UTC time stamp (RFC 3339, milliseconds), the level,
//! `[rank N]` when the process is one rank of several, then the message:
//!
//! ```text
//! 2026-11-23T20:41:07.512Z  INFO [rank 1] epoch 3 [ 400/5004] loss 3.1416 …
//! ```
//!
//! `RUST_LOG` picks what is shown (tracing-subscriber's filter syntax: `warn`, `debug`, `rn50=debug,info`);
//! `info` when unset. Results (tables, JSON) go to stdout with `println!`, never through here.
use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// Set by `rn50 launch` in its workers' environment when it prefixes their lines with `[rank N]` itself, so
/// that the worker does not write its rank twice.
pub const LAUNCHER_PREFIXES_RANK: &str = "RN50_LAUNCHER_PREFIXES_RANK";

/// Installs the subscriber for this process (once; later calls do nothing). `rank` is this process's rank
/// when it is one of several, `None` otherwise.
pub fn init(rank: Option<usize>) {
    let rank = rank.filter(|_| std::env::var_os(LAUNCHER_PREFIXES_RANK).is_none());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(Format {
            rank,
            ansi: std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
        })
        .try_init();
}

struct Format {
    rank: Option<usize>,
    ansi: bool,
}

impl<S, N> FormatEvent<S, N> for Format
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        Utc.format_time(&mut w)?;
        let level = *event.metadata().level();
        let colour = match level {
            tracing::Level::ERROR => "31",
            tracing::Level::WARN => "33",
            tracing::Level::INFO => "32",
            _ => "34",
        };
        if self.ansi {
            write!(w, " \x1b[{colour}m{level:>5}\x1b[0m")?;
        } else {
            write!(w, " {level:>5}")?;
        }
        if let Some(r) = self.rank {
            write!(w, " [rank {r}]")?;
        }
        w.write_char(' ')?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// tracing-subscriber's RFC 3339 UTC clock (`2026-11-23T20:41:07.512345Z`) cut to milliseconds.
struct Utc;

impl FormatTime for Utc {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let mut s = String::with_capacity(32);
        SystemTime.format_time(&mut Writer::new(&mut s))?;
        match (s.find('.'), s.ends_with('Z')) {
            (Some(dot), true) if s.len() > dot + 4 => write!(w, "{}Z", &s[..dot + 4]),
            _ => w.write_str(&s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_stamps_are_utc_with_milliseconds() {
        let mut s = String::new();
        Utc.format_time(&mut Writer::new(&mut s)).unwrap();
        // e.g. 2026-11-23T20:41:07.512Z
        assert_eq!(s.len(), 24, "{s}");
        assert!(
            s.ends_with('Z') && s.as_bytes()[10] == b'T' && s.as_bytes()[19] == b'.',
            "{s}"
        );
        let year: u32 = s[..4].parse().unwrap();
        assert!(year >= 2024, "{s}");
    }
}
