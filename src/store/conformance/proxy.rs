//! A TCP proxy on loopback whose network can be cut silently, for tests of what a node does
//! when its database stops answering without closing anything.
//!
//! [`FreezableProxy::freeze`] is a silent cut: no byte is forwarded in either direction and no
//! socket is closed; new connections are accepted and then hear nothing. On
//! [`FreezableProxy::heal`], new connections work again, and so do open connections that
//! carried no traffic during the cut — but a connection that had bytes in flight stays stalled
//! for good, as TCP's retransmission backoff keeps a real one for seconds to minutes after the
//! network is back. [`FreezableProxy::freeze_open`] stalls only the connections open now.
//!
//! A stalled connection still reads what its ends send (and holds it), so a test can tell
//! that the client closed it ([`FreezableProxy::closed_by_client`]).

#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// One proxied connection.
#[derive(Debug, Default)]
struct Link {
    /// Never forwards again.
    stalled: AtomicBool,
    /// The client closed its end.
    client_closed: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    frozen: AtomicBool,
    links: Mutex<Vec<Arc<Link>>>,
    tasks: Mutex<Vec<AbortHandle>>,
    accepted: AtomicUsize,
}

impl State {
    fn track(&self, h: AbortHandle) {
        self.tasks.lock().unwrap().push(h);
    }
}

/// A loopback TCP proxy to one upstream address that can be cut and healed; see the module
/// docs. Dropping it closes every connection.
#[derive(Debug)]
pub struct FreezableProxy {
    addr: SocketAddr,
    state: Arc<State>,
}

impl FreezableProxy {
    /// Starts a proxy on `127.0.0.1` (a free port) to `upstream`.
    pub async fn start(upstream: SocketAddr) -> FreezableProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                st.accepted.fetch_add(1, Ordering::SeqCst);
                let link = Arc::new(Link::default());
                st.links.lock().unwrap().push(Arc::clone(&link));
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = tokio::spawn(pump(cr, sw, Arc::clone(&st), Arc::clone(&link), true));
                let down = tokio::spawn(pump(sr, cw, Arc::clone(&st), link, false));
                st.track(up.abort_handle());
                st.track(down.abort_handle());
            }
        });
        state.track(accept.abort_handle());
        FreezableProxy { addr, state }
    }

    /// Starts a proxy to the server of a `postgres://` or `mysql://` URL.
    pub async fn to_url(url: &str) -> FreezableProxy {
        let u = url::Url::parse(url).unwrap();
        let host = u.host_str().unwrap();
        let port = u.port().unwrap_or(match u.scheme() {
            "mysql" | "mariadb" => 3306,
            _ => 5432,
        });
        let upstream = tokio::net::lookup_host((host, port))
            .await
            .unwrap()
            .next()
            .unwrap();
        FreezableProxy::start(upstream).await
    }

    /// `url` with its host and port replaced by this proxy's. On MySQL, also
    /// `prefer_socket=false`: the driver would otherwise move a loopback connection to the
    /// server's Unix socket, around the proxy.
    pub fn url_for(&self, url: &str) -> String {
        let mut u = url::Url::parse(url).unwrap();
        u.set_host(Some(&self.addr.ip().to_string())).unwrap();
        u.set_port(Some(self.addr.port())).unwrap();
        if matches!(u.scheme(), "mysql" | "mariadb") {
            u.query_pairs_mut().append_pair("prefer_socket", "false");
        }
        u.to_string()
    }

    /// Cuts the network silently: nothing is forwarded, nothing is closed.
    pub fn freeze(&self) {
        self.state.frozen.store(true, Ordering::SeqCst);
    }

    /// Stalls the connections open now, for good; new ones work.
    pub fn freeze_open(&self) {
        for l in self.state.links.lock().unwrap().iter() {
            l.stalled.store(true, Ordering::SeqCst);
        }
    }

    /// Ends the cut: new connections, and open ones that were idle during it, work again.
    pub fn heal(&self) {
        self.state.frozen.store(false, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Connections stalled for good.
    pub fn stalled(&self) -> usize {
        self.count(|l| l.stalled.load(Ordering::SeqCst))
    }

    /// Stalled connections whose client has closed its end (given up on them).
    pub fn closed_by_client(&self) -> usize {
        self.count(|l| l.stalled.load(Ordering::SeqCst) && l.client_closed.load(Ordering::SeqCst))
    }

    fn count(&self, f: impl Fn(&Link) -> bool) -> usize {
        self.state
            .links
            .lock()
            .unwrap()
            .iter()
            .filter(|l| f(l))
            .count()
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        for t in self.state.tasks.lock().unwrap().iter() {
            t.abort();
        }
    }
}

/// Copies `from` to `to` while the link flows. Bytes that arrive during a cut stall the link
/// for good; a stalled link keeps reading (and holding) what arrives, to see its end close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
    link: Arc<Link>,
    from_client: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            if from_client {
                link.client_closed.store(true, Ordering::SeqCst);
            }
            if link.stalled.load(Ordering::SeqCst) {
                // A silent cut: the other end hears nothing, not even the close.
                std::future::pending::<()>().await;
            }
            let _ = to.shutdown().await;
            return;
        }
        if state.frozen.load(Ordering::SeqCst) {
            link.stalled.store(true, Ordering::SeqCst);
        }
        if link.stalled.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
