//! TLS: `--require-tls` refuses plaintext URLs; amqps trusts the given CA file only.

use crate::common::*;

#[test]
fn require_tls_refuses_plaintext_urls() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", SMALL_BODY));
    let r = db.dlq(&["--require-tls", "replay", "d1", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("amqps"), "{}", r.stderr);
    assert_eq!(
        db.dlq(&["--require-tls", "list"]).code,
        0,
        "SQLite is a local file"
    );
    let pg = TestDb::migrated(Backend::Postgres);
    let r = pg.dlq_env(&["list"], &[("DLQ_REQUIRE_TLS", "true")]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("sslmode"), "{}", r.stderr);
    // sslmode is honoured: require encrypts; verify-full also checks the server's
    // certificate, which nothing here vouches for, so it is refused.
    let r = pg.dlq_env(
        &["list"],
        &[
            ("DLQ_REQUIRE_TLS", "1"),
            ("DLQ_DATABASE_URL", &format!("{}?sslmode=require", pg.url)),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    let r = pg.dlq_env(
        &["list"],
        &[
            ("DLQ_REQUIRE_TLS", "yes"),
            (
                "DLQ_DATABASE_URL",
                &format!("{}?sslmode=verify-full", pg.url),
            ),
        ],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert_eq!(db.show("d1")["state"], "pending");
}

/// A TLS endpoint of the tests' own in front of the plaintext broker.
fn tls_front() -> (u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dlq test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    let certs = vec![leaf.der().clone()];
    let key =
        tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect("127.0.0.1:5672").await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    (port, dir)
}

#[test]
fn amqps_trusts_the_given_ca_file_and_refuses_an_unknown_one() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_tls");
    let (port, dir) = tls_front();
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, SMALL_BODY));
    let url = format!("amqps://guest:guest@localhost:{port}/%2f");
    let r = db.dlq_env(
        &["replay", "d1", "--yes", "--connect-timeout", "5s"],
        &[("DLQ_AMQP_URL", &url)],
    );
    assert_eq!(r.code, 5, "an unknown CA is refused: {}", r.all());
    assert_eq!(rabbit.count(&q), 0);
    let ca = dir.path().join("ca.pem");
    let r = db.dlq_env(
        &[
            "--require-tls",
            "--amqp-ca-file",
            ca.to_str().unwrap(),
            "replay",
            "d1",
            "--yes",
        ],
        &[("DLQ_AMQP_URL", &url)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 1);
}
