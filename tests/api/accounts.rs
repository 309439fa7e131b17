//! Accounts over HTTP: the first administrator set up once, sign-in with a name and password
//! and its session cookie (HttpOnly, SameSite=Strict, CSRF-checked on writes), lockout after
//! repeated failures, disabled users refused at once, the admin endpoints for administrators
//! only, and a cookie that sees only its own user's data.

use crate::support;

use reqwest::header::{COOKIE, ORIGIN, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::{Backend, Home, TestApp};

const PASSWORD: &str = "correct horse battery";

/// A browser's session: the cookie the server set.
struct Browser {
    cookie: String,
}

/// The `mnemo_session=…` pair of a response's `Set-Cookie`, and the whole header.
fn session_cookie(response: &reqwest::Response) -> (String, String) {
    let header = response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .find(|value| value.starts_with("mnemo_session="))
        .expect("a session cookie is set")
        .to_string();
    let pair = header.split(';').next().unwrap().trim().to_string();
    (pair, header)
}

async fn sign_in_request(
    app: &TestApp,
    path: &str,
    name: &str,
    password: &str,
) -> reqwest::Response {
    app.client
        .post(app.url(path))
        .json(&json!({ "name": name, "password": password }))
        .send()
        .await
        .expect("request")
}

async fn sign_in(app: &TestApp, name: &str, password: &str) -> Browser {
    let response = sign_in_request(app, "/v1/auth/login", name, password).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (cookie, _) = session_cookie(&response);
    Browser { cookie }
}

/// A request as the browser's page would send it: the cookie, and on writes the CSRF header
/// and the page's own origin.
async fn browse(
    app: &TestApp,
    browser: &Browser,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let writes = method != Method::GET;
    let mut request = app
        .client
        .request(method, app.url(path))
        .header(COOKIE, &browser.cookie);
    if writes {
        request = request
            .header("X-Mnemo-CSRF", "1")
            .header(ORIGIN, app.base.as_str());
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn set_up_admin(app: &TestApp) -> Browser {
    let (status, body) = app.get("/v1/auth/status", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, json!({ "setup_required": true, "dev": false }));
    let response = sign_in_request(app, "/v1/auth/setup", "root", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (cookie, _) = session_cookie(&response);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["name"], "root");
    assert_eq!(body["is_admin"], true);
    Browser { cookie }
}

async fn create_user(app: &TestApp, admin: &Browser, name: &str, is_admin: bool) -> Value {
    let (status, body) = browse(
        app,
        admin,
        Method::POST,
        "/v1/admin/users",
        Some(json!({ "name": name, "password": PASSWORD, "is_admin": is_admin })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["name"], name);
    assert_eq!(body["has_password"], true);
    assert_eq!(body["is_admin"], is_admin);
    body
}

#[tokio::test]
async fn the_first_admin_is_set_up_once_and_signs_in_with_a_strict_http_only_cookie() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    // Too short a password is refused and leaves setup open.
    let response = sign_in_request(&app, "/v1/auth/setup", "root", "short").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let admin = set_up_admin(&app).await;

    // A second setup is refused, whatever the name.
    let response = sign_in_request(&app, "/v1/auth/setup", "mallory", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(response.headers().get(SET_COOKIE).is_none());
    let (_, body) = app.get("/v1/auth/status", None).await;
    assert_eq!(body["setup_required"], false);

    // Sign-in sets a cookie the page's scripts cannot read and other sites cannot send.
    let response = sign_in_request(&app, "/v1/auth/login", "root", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (pair, header) = session_cookie(&response);
    let attributes: Vec<_> = header.split(';').map(str::trim).collect();
    assert!(attributes.contains(&"HttpOnly"), "{header}");
    assert!(attributes.contains(&"SameSite=Strict"), "{header}");
    assert!(attributes.contains(&"Path=/"), "{header}");
    assert!(!attributes.contains(&"Secure"), "plain HTTP: {header}");
    assert!(pair.len() > "mnemo_session=".len() + 32);
    // Behind a TLS proxy the cookie is Secure.
    let response = app
        .client
        .post(app.url("/v1/auth/login"))
        .header("X-Forwarded-Proto", "https")
        .json(&json!({ "name": "root", "password": PASSWORD }))
        .send()
        .await
        .unwrap();
    let (_, header) = session_cookie(&response);
    assert!(header.split(';').any(|a| a.trim() == "Secure"), "{header}");

    // The cookie signs the user in; /v1/me says who and how.
    let (status, me) = browse(&app, &admin, Method::GET, "/v1/me", None).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["name"], "root");
    assert_eq!(me["is_admin"], true);
    assert_eq!(me["signed_in_via"], "session");
    // Only the token's hash is stored.
    let token = admin.cookie.trim_start_matches("mnemo_session=");
    let accounts = app.state.store.accounts();
    let now = mnemo::store::now();
    assert!(accounts.session_user(token, now).await.unwrap().is_none());
    let stored = accounts
        .session_user(&mnemo::auth::session::hash(token), now)
        .await
        .unwrap()
        .expect("the session is stored by its hash");
    assert_eq!(stored.user.name, "root");

    // Sign-out ends the session: the same cookie no longer works.
    let (status, _) = browse(&app, &admin, Method::POST, "/v1/auth/logout", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, body) = browse(&app, &admin, Method::GET, "/v1/me", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_cookie_write_needs_the_csrf_header_and_the_servers_own_origin() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let admin = set_up_admin(&app).await;

    // Reads with the cookie alone work.
    let response = app
        .client
        .get(app.url("/v1/threads"))
        .header(COOKIE, &admin.cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // A write without the header is refused, and stores nothing.
    let response = app
        .client
        .post(app.url("/v1/threads"))
        .header(COOKIE, &admin.cookie)
        .json(&json!({ "title": "forged" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("X-Mnemo-CSRF"),
        "{body}"
    );
    // With the header but from another origin: refused.
    let response = app
        .client
        .post(app.url("/v1/threads"))
        .header(COOKIE, &admin.cookie)
        .header("X-Mnemo-CSRF", "1")
        .header(ORIGIN, "https://evil.example")
        .json(&json!({ "title": "forged" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let (_, threads) = browse(&app, &admin, Method::GET, "/v1/threads", None).await;
    assert_eq!(threads["threads"], json!([]), "{threads}");

    // From the page itself: stored.
    let (status, thread) = browse(
        &app,
        &admin,
        Method::POST,
        "/v1/threads",
        Some(json!({ "title": "mine" })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{thread}");
    // The header without an Origin (a non-browser client holding the cookie) is enough.
    let response = app
        .client
        .post(app.url("/v1/threads"))
        .header(COOKIE, &admin.cookie)
        .header("X-Mnemo-CSRF", "1")
        .json(&json!({ "title": "scripted" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);

    // Bearer requests are unchanged: an API key writes without the header.
    let key = app.user_key("program").await;
    let (status, body) = app
        .post(
            "/v1/threads",
            Some(&key),
            Some(json!({ "title": "by key" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn five_wrong_passwords_lock_the_name_and_a_right_one_then_waits() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let admin = set_up_admin(&app).await;
    create_user(&app, &admin, "alice", false).await;

    for attempt in 1..=4 {
        let response = sign_in_request(&app, "/v1/auth/login", "alice", "wrong password").await;
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "attempt {attempt}"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["message"], "wrong name or password");
    }
    let response = sign_in_request(&app, "/v1/auth/login", "alice", "wrong password").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "900");
    // Locked: even the right password is refused, with a clear message.
    let response = sign_in_request(&app, "/v1/auth/login", "alice", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("too many failed sign-ins"),
        "{body}"
    );
    // Other names are not locked; an unknown name is refused like a wrong password.
    sign_in(&app, "root", PASSWORD).await;
    let response = sign_in_request(&app, "/v1/auth/login", "nobody", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    // An administrator setting a new password ends the lock.
    let (_, users) = browse(&app, &admin, Method::GET, "/v1/admin/users", None).await;
    let alice = user_id(&users, "alice");
    let (status, body) = browse(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/admin/users/{alice}"),
        Some(json!({ "password": "another good one" })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    sign_in(&app, "alice", "another good one").await;
    app.stop().await;
}

fn user_id(users: &Value, name: &str) -> String {
    users["users"]
        .as_array()
        .unwrap()
        .iter()
        .find(|user| user["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {users}"))["id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_disabled_users_cookie_and_key_stop_working_at_once() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let admin = set_up_admin(&app).await;
    let alice = create_user(&app, &admin, "alice", false).await;
    let alice_id = alice["id"].as_str().unwrap();
    let browser = sign_in(&app, "alice", PASSWORD).await;
    let (status, issued) = browse(
        &app,
        &admin,
        Method::POST,
        &format!("/v1/admin/users/{alice_id}/keys"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{issued}");
    let key = issued["key"].as_str().unwrap().to_string();
    assert!(key.starts_with(issued["prefix"].as_str().unwrap()));
    let (status, me) = app.get("/v1/me", Some(&key)).await;
    assert_eq!(
        (status, me["name"].as_str()),
        (StatusCode::OK, Some("alice"))
    );
    assert_eq!(me["signed_in_via"], "api_key");
    let (status, _) = browse(&app, &browser, Method::GET, "/v1/me", None).await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) = browse(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/admin/users/{alice_id}"),
        Some(json!({ "disabled": true })),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["disabled"], true);
    let (status, _) = browse(&app, &browser, Method::GET, "/v1/me", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = app.get("/v1/me", Some(&key)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Nor can she sign in again.
    let response = sign_in_request(&app, "/v1/auth/login", "alice", PASSWORD).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disabled"),
        "{body}"
    );

    // Enabled again, her key works; revoked, it does not.
    let (status, _) = browse(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/admin/users/{alice_id}"),
        Some(json!({ "disabled": false })),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = app.get("/v1/me", Some(&key)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, revoked) = browse(
        &app,
        &admin,
        Method::DELETE,
        &format!("/v1/admin/users/{alice_id}/keys"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked"], 1);
    let (status, _) = app.get("/v1/me", Some(&key)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // An administrator cannot disable themselves.
    let (_, me) = browse(&app, &admin, Method::GET, "/v1/me", None).await;
    let (status, body) = browse(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/admin/users/{}", me["id"].as_str().unwrap()),
        Some(json!({ "disabled": true })),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    app.stop().await;
}

#[tokio::test]
async fn only_administrators_reach_the_admin_endpoints() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let admin = set_up_admin(&app).await;
    let bob = create_user(&app, &admin, "bob", false).await;
    let bob_id = bob["id"].as_str().unwrap();
    let browser = sign_in(&app, "bob", PASSWORD).await;
    let key = app.user_key("carol").await;
    let calls = [
        (Method::GET, "/v1/admin/users".to_string(), None),
        (
            Method::POST,
            "/v1/admin/users".to_string(),
            Some(json!({ "name": "eve", "password": PASSWORD, "is_admin": true })),
        ),
        (
            Method::PATCH,
            format!("/v1/admin/users/{bob_id}"),
            Some(json!({ "is_admin": true })),
        ),
        (Method::POST, format!("/v1/admin/users/{bob_id}/keys"), None),
        (
            Method::DELETE,
            format!("/v1/admin/users/{bob_id}/keys"),
            None,
        ),
    ];
    for (method, path, body) in calls {
        let (status, answer) = browse(&app, &browser, method.clone(), &path, body.clone()).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{method} {path} by cookie: {answer}"
        );
        let (status, answer) = app.call(method.clone(), &path, Some(&key), body).await;
        assert_eq!(
            status,
            StatusCode::FORBIDDEN,
            "{method} {path} by key: {answer}"
        );
        let (status, _) = app.call(method.clone(), &path, None, None).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "{method} {path} signed out"
        );
    }
    let (_, users) = browse(&app, &admin, Method::GET, "/v1/admin/users", None).await;
    let names: Vec<_> = users["users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|user| {
            (
                user["name"].as_str().unwrap(),
                user["is_admin"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(names, [("bob", false), ("carol", false), ("root", true)]);
    let (_, me) = browse(&app, &browser, Method::GET, "/v1/me", None).await;
    assert_eq!(me["is_admin"], false);
    // An unknown id is 404, a name taken 409, a bad password 400.
    let (status, _) = browse(
        &app,
        &admin,
        Method::PATCH,
        &format!("/v1/admin/users/{}", uuid::Uuid::now_v7()),
        Some(json!({ "is_admin": true })),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = browse(
        &app,
        &admin,
        Method::POST,
        "/v1/admin/users",
        Some(json!({ "name": "bob", "password": PASSWORD })),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _) = browse(
        &app,
        &admin,
        Method::POST,
        "/v1/admin/users",
        Some(json!({ "name": "dave", "password": "short" })),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    app.stop().await;
}

#[tokio::test]
async fn a_user_made_by_the_admin_signs_in_and_sees_only_their_own_threads() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let home = Home::new(backend).await;
        let app = TestApp::spawn(&home).await;
        let admin = set_up_admin(&app).await;
        create_user(&app, &admin, "alice", false).await;
        let alice = sign_in(&app, "alice", PASSWORD).await;
        let (_, me) = browse(&app, &alice, Method::GET, "/v1/me", None).await;
        assert_eq!(
            (me["name"].as_str(), me["is_admin"].as_bool()),
            (Some("alice"), Some(false))
        );

        let (status, thread) = browse(
            &app,
            &admin,
            Method::POST,
            "/v1/threads",
            Some(json!({ "title": "the admin's own" })),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{thread}");
        let id = thread["id"].as_str().unwrap();
        let (status, _) = browse(
            &app,
            &alice,
            Method::GET,
            &format!("/v1/threads/{id}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{backend:?}");
        let (status, _) = browse(
            &app,
            &alice,
            Method::DELETE,
            &format!("/v1/threads/{id}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{backend:?}");
        let (_, listed) = browse(&app, &alice, Method::GET, "/v1/threads", None).await;
        assert_eq!(listed["threads"], json!([]));
        let (status, own) = browse(
            &app,
            &admin,
            Method::GET,
            &format!("/v1/threads/{id}"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(own["thread"]["title"], "the admin's own", "{own}");
        app.stop().await;
    }
}
