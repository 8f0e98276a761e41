use std::time::Instant;

use axum::extract::ConnectInfo;
use axum::routing::get;
use mira_testkit::certs::{Ca, Leaf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::http::HttpServer;

/// A server whose one route says who the peer is.
async fn server(tls: Arc<ServerTls>) -> HttpServer {
    let app = axum::Router::new().route(
        "/who",
        get(|ConnectInfo(p): ConnectInfo<PeerInfo>| async move {
            format!("tls={} cert={} member={}", p.tls, p.client_cert, p.cluster_member)
        }),
    );
    HttpServer::bind("127.0.0.1:0".parse().expect("addr"), app, "test", Some(tls))
        .await
        .expect("bind")
}

fn client_config(ca: &Ca, identity: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.pem().as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
    Arc::new(match identity {
        None => b.with_no_client_auth(),
        Some(l) => b
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(l.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("chain"),
                PrivateKeyDer::from_pem_slice(l.key_pem.as_bytes()).expect("key"),
            )
            .expect("client auth"),
    })
}

type Stream = tokio_rustls::client::TlsStream<TcpStream>;

async fn connect(addr: SocketAddr, config: Arc<rustls::ClientConfig>) -> io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// One HTTP/1.1 request on an open connection; the body of the answer.
async fn who(s: &mut Stream) -> io::Result<String> {
    s.write_all(b"GET /who HTTP/1.1\r\nHost: localhost\r\n\r\n").await?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return Ok(body[..len].to_owned());
            }
        }
    }
}

fn peer_cert(s: &Stream) -> Vec<u8> {
    s.get_ref().1.peer_certificates().expect("server certificate")[0].to_vec()
}

#[tokio::test]
async fn a_rotated_certificate_is_served_to_new_connections_while_old_ones_stay() {
    let dir = tempfile::tempdir().expect("test setup");
    let ca = Ca::new("test CA");
    let first = ca.leaf("first");
    let (cert, key) = first.write(dir.path(), "server");
    let tls = ServerTls::load(ServerFiles {
        cert,
        key,
        client_ca: None,
        cluster_ca: None,
    })
    .expect("load");
    let _watch = tls.watch(Duration::from_millis(20));
    let srv = server(tls).await;
    let config = client_config(&ca, None);
    let mut kept = connect(srv.addr(), config.clone()).await.expect("connect");
    assert_eq!(peer_cert(&kept), first.der);
    assert_eq!(
        who(&mut kept).await.expect("request"),
        "tls=true cert=false member=false"
    );

    let second = ca.leaf("second");
    second.write(dir.path(), "server");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let fresh = connect(srv.addr(), config.clone()).await.expect("connect");
        if peer_cert(&fresh) == second.der {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new connections never got the rotated certificate"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The connection made before the rotation still answers.
    assert_eq!(
        who(&mut kept).await.expect("old connection"),
        "tls=true cert=false member=false"
    );
    assert_eq!(peer_cert(&kept), first.der);

    // A half-written rotation (a key that does not match) keeps the one in use.
    let third = ca.leaf("third");
    mira_testkit::certs::write_atomic(&dir.path().join("server.crt"), &third.cert_pem);
    assert!(
        ServerTls::load(ServerFiles {
            cert: dir.path().join("server.crt"),
            key: dir.path().join("server.key"),
            client_ca: None,
            cluster_ca: None,
        })
        .is_err()
    );
    let fresh = connect(srv.addr(), config).await.expect("still served");
    assert_eq!(peer_cert(&fresh), second.der);
    srv.shutdown().await;
}

#[tokio::test]
async fn client_certificates_are_required_and_checked() {
    let dir = tempfile::tempdir().expect("test setup");
    let ca = Ca::new("server and client CA");
    let other = Ca::new("someone else's CA");
    let (cert, key) = ca.leaf("server").write(dir.path(), "server");
    let tls = ServerTls::load(ServerFiles {
        cert,
        key,
        client_ca: Some(ca.write(dir.path(), "ca.crt")),
        cluster_ca: None,
    })
    .expect("load");
    assert!(tls.requires_client_cert());
    let srv = server(tls).await;
    let good = ca.leaf("client");
    let mut s = connect(srv.addr(), client_config(&ca, Some(&good)))
        .await
        .expect("connect");
    assert_eq!(who(&mut s).await.expect("request"), "tls=true cert=true member=false");
    // Without a certificate, with one of another CA, with an expired one:
    // refused (TLS 1.3 reports a refused client certificate on the first read).
    for identity in [None, Some(other.leaf("intruder")), Some(ca.expired_leaf("expired"))] {
        let refused = match connect(srv.addr(), client_config(&ca, identity.as_ref())).await {
            Err(_) => true,
            Ok(mut s) => who(&mut s).await.is_err(),
        };
        assert!(refused, "{:?} was let in", identity.map(|l| l.cert_pem.len()));
    }
    srv.shutdown().await;
}

#[tokio::test]
async fn a_cluster_ca_marks_members_without_requiring_certificates() {
    let dir = tempfile::tempdir().expect("test setup");
    let ca = Ca::new("server CA");
    let cluster = Ca::new("cluster CA");
    let (cert, key) = ca.leaf("server").write(dir.path(), "server");
    let tls = ServerTls::load(ServerFiles {
        cert,
        key,
        client_ca: None,
        cluster_ca: Some(cluster.write(dir.path(), "cluster.crt")),
    })
    .expect("load");
    let srv = server(tls).await;
    let mut anon = connect(srv.addr(), client_config(&ca, None)).await.expect("connect");
    assert_eq!(
        who(&mut anon).await.expect("request"),
        "tls=true cert=false member=false"
    );
    let member = cluster.leaf("catalog-1");
    let mut m = connect(srv.addr(), client_config(&ca, Some(&member)))
        .await
        .expect("connect");
    assert_eq!(who(&mut m).await.expect("request"), "tls=true cert=true member=true");
    srv.shutdown().await;
}

#[tokio::test]
async fn bad_files_are_named() {
    let dir = tempfile::tempdir().expect("test setup");
    let ca = Ca::new("ca");
    let (cert, key) = ca.leaf("server").write(dir.path(), "server");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").expect("test setup");
    for (files, word) in [
        (
            ServerFiles {
                cert: dir.path().join("missing.crt"),
                key: key.clone(),
                client_ca: None,
                cluster_ca: None,
            },
            "missing.crt",
        ),
        (
            ServerFiles {
                cert: junk.clone(),
                key: key.clone(),
                client_ca: None,
                cluster_ca: None,
            },
            "junk.pem",
        ),
        (
            ServerFiles {
                cert: cert.clone(),
                key: junk.clone(),
                client_ca: None,
                cluster_ca: None,
            },
            "junk.pem",
        ),
        (
            ServerFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: Some(junk.clone()),
                cluster_ca: None,
            },
            "junk.pem",
        ),
    ] {
        let e = ServerTls::load(files).expect_err(word);
        assert!(e.to_string().contains(word), "{e}");
    }
    let e = ClientTls::load(ClientFiles {
        ca: junk,
        identity: None,
    })
    .expect_err("junk CA");
    assert!(e.to_string().contains("junk.pem"), "{e}");
}

#[tokio::test]
async fn serve_takes_plain_tcp_from_loopback_beside_tls() {
    let dir = tempfile::tempdir().expect("test setup");
    let ca = Ca::new("ca");
    let (cert, key) = ca.leaf("server").write(dir.path(), "server");
    let files = ServerFiles {
        cert,
        key,
        client_ca: None,
        cluster_ca: None,
    };
    for (plain_loopback, answered) in [(true, true), (false, false)] {
        let srv = server(ServerTls::load_with(files.clone(), plain_loopback).expect("load")).await;
        let mut tcp = TcpStream::connect(srv.addr()).await.expect("connect");
        tcp.write_all(b"GET /who HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .expect("write");
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(20), tcp.read(&mut buf))
            .await
            .expect("an answer or a close")
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        assert_eq!(text.contains("tls=false"), answered, "{plain_loopback}: {text}");
        // TLS still works beside it.
        let mut s = connect(srv.addr(), client_config(&ca, None)).await.expect("tls");
        assert_eq!(who(&mut s).await.expect("request"), "tls=true cert=false member=false");
        srv.shutdown().await;
    }
}
