//! Where a handler panicked: the file, line and column of the `panic!` (and the backtrace,
//! when `RUST_BACKTRACE` or `RUST_LIB_BACKTRACE` asks for one), kept in the failure's
//! `detail` under `panic`; and a panic's message, for handlers' and reconcilers' tasks alike.
//!
//! A panic's payload carries only its message; its location reaches the panic hook alone. So
//! jobvisor adds a hook, once per process, in front of the one installed before it (the
//! application's, or the standard one that prints the panic): it records the location only
//! while a handler's task is being polled on that thread ([`in_handler`]), into a thread-local
//! slot that the task reads when it catches the unwind ([`take`]), and then calls the hook
//! before it, so nothing the application set up changes. A hook the application installs
//! later should chain to the one it replaces (`std::panic::take_hook`) to keep this.

use std::backtrace::Backtrace;
use std::cell::{Cell, RefCell};
use std::ffi::OsString;
use std::panic::PanicHookInfo;
use std::sync::{Once, OnceLock};

use serde_json::{json, Value};

/// The longest backtrace kept, in bytes; a longer one is cut at a line's end.
const MAX_BACKTRACE: usize = 16 * 1024;

/// Where a panic was raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PanicSite {
    pub(crate) file: String,
    pub(crate) line: u32,
    pub(crate) column: u32,
    /// Captured only when the environment asks for backtraces.
    pub(crate) backtrace: Option<String>,
}

impl PanicSite {
    /// `file:line:column`.
    pub(crate) fn location(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.column)
    }

    /// The failure's `detail`: `{"panic": {"file", "line", "column", "backtrace"?}}`.
    pub(crate) fn detail(&self) -> Value {
        let mut site = json!({ "file": self.file, "line": self.line, "column": self.column });
        if let (Some(bt), Value::Object(m)) = (&self.backtrace, &mut site) {
            m.insert("backtrace".into(), Value::String(bt.clone()));
        }
        json!({ "panic": site })
    }
}

thread_local! {
    /// True while a handler's task is polled (or its handler dropped) on this thread.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    /// The last panic raised on this thread while `IN_HANDLER` was set.
    static LAST: RefCell<Option<PanicSite>> = const { RefCell::new(None) };
}

static INSTALL: Once = Once::new();

/// Adds jobvisor's hook in front of the current one, once per process.
pub(crate) fn install() {
    INSTALL.call_once(chain);
}

/// Adds the hook in front of the current one (unguarded: [`install`] calls it once).
fn chain() {
    let before = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        record(info);
        before(info);
    }));
}

fn record(info: &PanicHookInfo<'_>) {
    if !IN_HANDLER.with(Cell::get) {
        return;
    }
    let Some(loc) = info.location() else {
        return;
    };
    let backtrace = backtraces_wanted().then(|| cut(Backtrace::force_capture().to_string()));
    let site = PanicSite {
        file: loc.file().to_string(),
        line: loc.line(),
        column: loc.column(),
        backtrace,
    };
    // A hook must not panic: a slot already borrowed (it never is) keeps its value.
    LAST.with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = Some(site);
        }
    });
}

/// Whether the environment asks for backtraces, read once: std's rule for library
/// backtraces ([`asks_for_backtraces`]).
fn backtraces_wanted() -> bool {
    static WANTED: OnceLock<bool> = OnceLock::new();
    *WANTED.get_or_init(|| {
        asks_for_backtraces(
            std::env::var_os("RUST_LIB_BACKTRACE"),
            std::env::var_os("RUST_BACKTRACE"),
        )
    })
}

/// `RUST_LIB_BACKTRACE` decides if set, else `RUST_BACKTRACE`: any value but `0` asks.
pub(crate) fn asks_for_backtraces(lib: Option<OsString>, any: Option<OsString>) -> bool {
    lib.or(any).is_some_and(|v| v != "0")
}

/// `bt` cut to [`MAX_BACKTRACE`] bytes at a line's end, saying so.
fn cut(bt: String) -> String {
    if bt.len() <= MAX_BACKTRACE {
        return bt;
    }
    let end = bt[..MAX_BACKTRACE].rfind('\n').unwrap_or(0);
    format!("{}\n(cut at {MAX_BACKTRACE} bytes)", &bt[..end])
}

/// Runs `f` as handler code: a panic in it records its site for [`take`].
pub(crate) fn in_handler<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            IN_HANDLER.with(|h| h.set(self.0));
        }
    }
    let _restore = Restore(IN_HANDLER.with(|h| h.replace(true)));
    f()
}

/// The site of the panic just caught on this thread, if it was raised in handler code.
/// Called where the unwind is caught, on the thread that panicked.
pub(crate) fn take() -> Option<PanicSite> {
    LAST.with(|l| l.try_borrow_mut().ok().and_then(|mut l| l.take()))
}

/// The message of a handler (or reconciler) task's panic.
pub(crate) fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload_message(&*payload),
        Err(_) => "unknown".into(),
    }
}

/// The message a panic was raised with.
pub(crate) fn payload_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_panic_in_handler_code_names_its_line_and_the_hook_before_still_runs() {
        // The hook installed before (the application's) must keep running.
        let called = Arc::new(AtomicUsize::new(0));
        let seen = called.clone();
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            seen.fetch_add(1, Ordering::SeqCst);
            before(info);
        }));
        chain();

        let line = line!() + 1;
        let r = std::panic::catch_unwind(|| in_handler(|| panic!("in a handler")));
        assert!(r.is_err());
        let site = take().expect("the site was recorded");
        assert_eq!((site.file.as_str(), site.line), (file!(), line), "{site:?}");
        assert!(site.column > 0);
        assert!(called.load(Ordering::SeqCst) >= 1, "the hook before ran");
        assert!(
            site.location().starts_with(&format!("{}:{line}:", file!())),
            "{}",
            site.location()
        );
        assert_eq!(site.detail()["panic"]["line"], line);

        // Outside handler code nothing is recorded, and the flag was restored on unwind.
        let r = std::panic::catch_unwind(|| panic!("not in a handler"));
        assert!(r.is_err());
        assert_eq!(take(), None);
    }

    #[test]
    fn backtraces_are_taken_when_the_environment_asks() {
        let v = |s: &str| Some(OsString::from(s));
        assert!(!asks_for_backtraces(None, None));
        assert!(asks_for_backtraces(None, v("1")));
        assert!(asks_for_backtraces(None, v("full")));
        assert!(!asks_for_backtraces(None, v("0")));
        // The library's own variable wins either way.
        assert!(!asks_for_backtraces(v("0"), v("1")));
        assert!(asks_for_backtraces(v("1"), v("0")));
        let site = PanicSite {
            file: "src/a.rs".into(),
            line: 3,
            column: 9,
            backtrace: Some("0: frame".into()),
        };
        assert_eq!(site.detail()["panic"]["backtrace"], "0: frame");
        let site = PanicSite {
            backtrace: None,
            ..site
        };
        assert!(site.detail()["panic"].get("backtrace").is_none());
    }

    #[test]
    fn a_long_backtrace_is_cut_at_a_line_end() {
        let bt = "frame\n".repeat(MAX_BACKTRACE);
        let c = cut(bt);
        assert!(c.len() < MAX_BACKTRACE + 40, "{}", c.len());
        assert!(c.ends_with("(cut at 16384 bytes)"));
        assert_eq!(cut("short".into()), "short");
    }
}
