use std::time::UNIX_EPOCH;

use super::*;

const TOKEN_A: &str = "token-of-acme";
const TOKEN_AB: &str = "token-of-acme-and-beta";
const TOKEN_OLD: &str = "token-that-expired";

fn file_text() -> String {
    format!(
        r#"
[[token]]
name = "collector-acme"
sha256 = "{}"
tenants = ["acme"]
scopes = ["write", "read"]

[[token]]
name = "grafana"
sha256 = "{}"
tenants = ["acme", "beta"]
scopes = ["read"]

[[token]]
name = "old"
sha256 = "{}"
tenants = ["acme"]
scopes = ["read", "write", "admin"]
expires = "2020-01-01T00:00:00Z"
"#,
        hash_token(TOKEN_A),
        hash_token(TOKEN_AB).to_ascii_uppercase(),
        hash_token(TOKEN_OLD)
    )
}

fn tokens_auth(dir: &Path) -> Arc<Authenticator> {
    let path = dir.join("tokens.toml");
    std::fs::write(&path, file_text()).expect("test setup");
    let (clock, _) = Clock::manual(UNIX_EPOCH + Duration::from_secs(1_800_000_000));
    Authenticator::new(
        &AuthConfig {
            mode: AuthMode::Tokens,
            tokens_file: Some(path),
            trusted_proxies: vec![],
        },
        clock,
        &crate::telemetry::Telemetry::new(),
    )
    .expect("test setup")
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).expect("test setup"),
            HeaderValue::from_str(v).expect("test setup"),
        );
    }
    h
}

fn bearer(t: &str) -> String {
    format!("Bearer {t}")
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

#[test]
fn the_hash_is_sha256_hex() {
    assert_eq!(
        hash_token("test"),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    );
    let t = new_token().expect("random");
    assert_eq!(t.len(), 64);
    assert_ne!(t, new_token().expect("random"));
}

#[test]
fn tokens_grant_their_tenants_and_scopes_only() {
    let dir = tempfile::tempdir().expect("test setup");
    let auth = tokens_auth(dir.path());
    let ok = |h: &[(&str, &str)], scope| auth.authorize(&headers(h), None, scope, false);
    // A single-tenant token may omit the header.
    let p = ok(&[("authorization", &bearer(TOKEN_A))], Scope::Write).expect("acme writes");
    assert_eq!((p.tenant.as_str(), p.who.as_str()), ("acme", "collector-acme"));
    let p = ok(
        &[("authorization", &bearer(TOKEN_A)), ("x-scope-orgid", "acme")],
        Scope::Read,
    )
    .expect("reads");
    assert_eq!(p.tenant.as_str(), "acme");
    // Grafana's basic auth: the token is the password; the user is ignored.
    let p = ok(
        &[
            ("authorization", &basic("grafana", TOKEN_AB)),
            ("x-scope-orgid", "beta"),
        ],
        Scope::Read,
    )
    .expect("basic");
    assert_eq!(p.tenant.as_str(), "beta");
    // Scheme names are case-insensitive.
    ok(&[("authorization", &format!("bearer {TOKEN_A}"))], Scope::Read).expect("lowercase scheme");

    // Outside the grant: 403, the same words whether the tenant exists or not.
    for (h, scope) in [
        (
            vec![("authorization", bearer(TOKEN_A)), ("x-scope-orgid", "beta".to_owned())],
            Scope::Read,
        ),
        (
            vec![
                ("authorization", bearer(TOKEN_A)),
                ("x-scope-orgid", "nobody".to_owned()),
            ],
            Scope::Read,
        ),
        (
            vec![
                ("authorization", bearer(TOKEN_AB)),
                ("x-scope-orgid", "acme".to_owned()),
            ],
            Scope::Write,
        ),
        (vec![("authorization", bearer(TOKEN_A))], Scope::Admin),
    ] {
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let e = ok(&h, scope).expect_err("outside the grant");
        assert_eq!(e, AuthError::Forbidden { scope }, "{h:?}");
        assert_eq!(e.error_code().http_status(), 403);
        assert!(
            !e.to_string().contains("beta") && !e.to_string().contains("nobody"),
            "{e}"
        );
    }
    // A token of several tenants must name one.
    let e = ok(&[("authorization", &bearer(TOKEN_AB))], Scope::Read).expect_err("which tenant");
    assert_eq!(e.error_code().http_status(), 400);
    assert!(e.to_string().contains("more than one tenant"), "{e}");
}

#[test]
fn missing_bad_expired_and_malformed_credentials_are_401() {
    let dir = tempfile::tempdir().expect("test setup");
    let auth = tokens_auth(dir.path());
    let long = "x".repeat(MAX_TOKEN_LEN + 1);
    let cases: Vec<Vec<(&str, String)>> = vec![
        vec![],
        vec![("x-scope-orgid", "acme".to_owned())],
        vec![("authorization", bearer("wrong"))],
        vec![("authorization", bearer(TOKEN_OLD))],
        vec![("authorization", basic("acme", "wrong"))],
        vec![("authorization", "Bearer".to_owned())],
        vec![("authorization", "Bearer ".to_owned())],
        vec![("authorization", "Token abc".to_owned())],
        vec![("authorization", "Basic !!!notbase64".to_owned())],
        vec![(
            "authorization",
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("no-colon")),
        )],
        vec![("authorization", bearer(&long))],
        vec![("authorization", bearer(TOKEN_A)), ("authorization", bearer(TOKEN_A))],
    ];
    for h in cases {
        let hv: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let e = auth
            .authorize(&headers(&hv), None, Scope::Read, false)
            .expect_err("refused");
        assert!(matches!(e, AuthError::Unauthenticated(_)), "{hv:?}: {e:?}");
        assert_eq!(e.error_code().http_status(), 401);
        assert_eq!(e.error_code().grpc_code(), tonic::Code::Unauthenticated);
        let r = e.http_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert!(r.headers().contains_key(header::WWW_AUTHENTICATE));
    }
    // Non-ASCII bytes in the header.
    let mut h = HeaderMap::new();
    h.insert(
        header::AUTHORIZATION,
        HeaderValue::from_bytes(b"Bearer \xff\xfe").expect("test setup"),
    );
    assert!(matches!(
        auth.authorize(&h, None, Scope::Read, false),
        Err(AuthError::Unauthenticated(_))
    ));
}

#[test]
fn hostile_tenant_headers_are_400_naming_the_header() {
    let dir = tempfile::tempdir().expect("test setup");
    let auth = tokens_auth(dir.path());
    let open = Authenticator::open();
    for bad in [
        "../beta",
        "acme/../beta",
        "a b",
        "ac\u{200b}me",
        "ａｃｍｅ",
        "..",
        &"a".repeat(300),
    ] {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(&bearer(TOKEN_A)).expect("test setup"),
        );
        // Some of these are not even valid header values; those never
        // reach us. The rest must be refused by name.
        let Ok(v) = HeaderValue::from_str(bad) else { continue };
        h.insert(TENANT_HEADER, v);
        for a in [&auth, &open] {
            let e = a.authorize(&h, None, Scope::Read, false).expect_err(bad);
            assert!(matches!(e, AuthError::BadTenant(_)), "{bad:?}: {e:?}");
            assert!(e.to_string().starts_with("X-Scope-OrgID"), "{e}");
        }
    }
    let mut h = HeaderMap::new();
    h.insert(
        TENANT_HEADER,
        HeaderValue::from_bytes("ａｃｍｅ".as_bytes()).expect("test setup"),
    );
    assert!(matches!(
        open.authorize(&h, None, Scope::Read, false),
        Err(AuthError::BadTenant(_))
    ));
}

#[test]
fn none_mode_takes_the_header_or_the_default() {
    let open = Authenticator::open();
    let p = open
        .authorize(&HeaderMap::new(), None, Scope::Write, false)
        .expect("default");
    assert_eq!(p.tenant.as_str(), "default");
    let e = open
        .authorize(&HeaderMap::new(), None, Scope::Write, true)
        .expect_err("required");
    assert_eq!(e.error_code().http_status(), 400);
    let p = open
        .authorize(&headers(&[("x-scope-orgid", "beta")]), None, Scope::Read, true)
        .expect("named");
    assert_eq!(p.tenant.as_str(), "beta");
}

#[test]
fn trusted_header_believes_only_the_proxies() {
    let auth = Authenticator::new(
        &AuthConfig {
            mode: AuthMode::TrustedHeader,
            tokens_file: None,
            trusted_proxies: vec!["10.1.0.0/16".parse().expect("net"), "::1".parse().expect("addr")],
        },
        Clock::system(),
        &crate::telemetry::Telemetry::new(),
    )
    .expect("test setup");
    let h = headers(&[("x-scope-orgid", "acme")]);
    let ip = |s: &str| Some(s.parse::<IpAddr>().expect("ip"));
    for from in ["10.1.2.3", "::1", "::ffff:10.1.9.9"] {
        assert_eq!(
            auth.authorize(&h, ip(from), Scope::Read, false)
                .expect(from)
                .tenant
                .as_str(),
            "acme"
        );
    }
    for from in [Some("10.2.0.1"), Some("127.0.0.1"), None] {
        let e = auth
            .authorize(&h, from.and_then(&ip), Scope::Read, false)
            .expect_err("not a proxy");
        assert!(matches!(e, AuthError::Unauthenticated(_)), "{from:?}");
    }
    assert!("10.0.0.0/33".parse::<ProxyNet>().is_err());
    assert!("gateway".parse::<ProxyNet>().expect_err("name").contains("gateway"));
    let e = Authenticator::new(
        &AuthConfig {
            mode: AuthMode::TrustedHeader,
            ..AuthConfig::default()
        },
        Clock::system(),
        &crate::telemetry::Telemetry::new(),
    )
    .expect_err("no proxies");
    assert_eq!(e.field, "security.trusted_proxies");
}

#[test]
fn bad_tokens_files_are_refused_naming_the_entry() {
    let p = Path::new("/etc/mira/tokens.toml");
    let h = hash_token("x");
    for (text, words) in [
        (
            "[[token]]\nname = \"a\"\nsha256 = \"abc\"\ntenants = [\"acme\"]\nscopes = [\"read\"]\n",
            "64 hex",
        ),
        (
            &*format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = []\nscopes = [\"read\"]\n"),
            "tenants is empty",
        ),
        (
            &*format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"../x\"]\nscopes = [\"read\"]\n"),
            "tenants",
        ),
        (
            &*format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = [\"root\"]\n"),
            "root",
        ),
        (
            &*format!("[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = []\n"),
            "scopes is empty",
        ),
        (
            &*format!(
                "[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = [\"read\"]\nexpires = \"soon\"\n"
            ),
            "expires",
        ),
        (
            &*format!(
                "[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = [\"read\"]\n[[token]]\nname = \"b\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = [\"read\"]\n"
            ),
            "listed twice",
        ),
        (
            &*format!(
                "[[token]]\nname = \"a\"\nsha256 = \"{h}\"\ntenants = [\"x\"]\nscopes = [\"read\"]\ntoken = \"plain\"\n"
            ),
            "token",
        ),
        ("[[token]]\nname = \"a\"\n", "sha256"),
        ("not toml at all [", "tokens file"),
    ] {
        let e = TokenSet::parse(p, text).expect_err(text);
        assert!(e.to_string().contains(words), "{text}: {e}");
        assert!(e.to_string().contains("/etc/mira/tokens.toml"), "{e}");
    }
    assert!(TokenSet::parse(p, "").expect("empty file: no tokens").is_empty());
}

#[test]
fn oversized_tokens_files_are_refused() {
    let dir = tempfile::tempdir().expect("test setup");
    let p = dir.path().join("tokens.toml");
    let f = std::fs::File::create(&p).expect("test setup");
    f.set_len(MAX_TOKENS_FILE + 1).expect("test setup");
    let e = TokenSet::load(&p).expect_err("too big");
    assert!(e.reason.contains("more than"), "{e}");
}

#[tokio::test]
async fn a_changed_file_is_reloaded_and_a_broken_one_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().expect("test setup");
    let auth = tokens_auth(dir.path());
    let path = dir.path().join("tokens.toml");
    let h = headers(&[("authorization", &bearer(TOKEN_A))]);
    auth.authorize(&h, None, Scope::Read, false).expect("listed");
    let watcher = auth.watch(Duration::from_millis(20)).expect("tokens mode watches");
    // Revoke: the token is removed from the file.
    let without_a: String = file_text().replacen(&hash_token(TOKEN_A), &hash_token("replacement"), 1);
    std::fs::write(&path, &without_a).expect("test setup");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while auth.authorize(&h, None, Scope::Read, false).is_ok() {
        assert!(std::time::Instant::now() < deadline, "the revoked token still works");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A broken file: the tokens in use stay.
    std::fs::write(&path, "[[token]]\nbroken").expect("test setup");
    assert!(!auth.reload());
    let r = headers(&[("authorization", &bearer("replacement"))]);
    auth.authorize(&r, None, Scope::Read, false)
        .expect("still the last good file");
    watcher.abort();
}
