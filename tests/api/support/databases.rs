//! Fresh test databases: an empty PostgreSQL database per test and a new SQLite file. Shared
//! by the integration tests (`support::databases`) and the library's unit tests (included there
//! as `crate::testing` under `cfg(test)`), so neither the server library nor the binary carries
//! it.

/// The administrative connection used to create test databases
/// (`MNEMO_TEST_POSTGRES_URL`, default `postgres://postgres@127.0.0.1:5432/postgres`).
pub fn postgres_admin_url() -> String {
    std::env::var("MNEMO_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// Creates an empty database named `mnemo_test_<uuid>` and returns its URL. Panics (failing
/// the test) when PostgreSQL is unreachable: the suite runs against both backends.
pub async fn fresh_postgres_url() -> String {
    use sqlx::Connection;
    let admin = postgres_admin_url();
    let mut connection = sqlx::PgConnection::connect(&admin)
        .await
        .unwrap_or_else(|error| panic!("PostgreSQL at {admin} is needed by this test: {error}"));
    let name = format!("mnemo_test_{}", uuid::Uuid::now_v7().simple());
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut connection)
        .await
        .unwrap_or_else(|error| panic!("creating test database {name}: {error}"));
    let _ = connection.close().await;
    match admin.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => panic!("MNEMO_TEST_POSTGRES_URL must end with /DATABASE"),
    }
}

/// A SQLite URL for a new file in `dir`.
pub fn sqlite_url(dir: &std::path::Path) -> String {
    format!("sqlite://{}?mode=rwc", dir.join("mnemo.db").display())
}
