//! Text columns read into their enums (declared with [`crate::enums::text_enum!`]): `decode`
//! turns a column's text into the enum or a decode error naming the column, so a corrupt row
//! fails loudly instead of being read as some default.

use crate::enums::UnknownText;

/// A text column decoded into its enum, or a decode error naming the column.
pub(crate) fn decode<T: std::str::FromStr<Err = UnknownText>>(
    column: &str,
    text: &str,
) -> Result<T, sqlx::Error> {
    text.parse().map_err(|error: UnknownText| {
        sqlx::Error::Decode(format!("column {column}: {error}").into())
    })
}

#[cfg(test)]
mod tests {
    use crate::store::{LogOp, RunStatus};

    #[test]
    fn unknown_text_is_an_error_not_a_default() {
        assert_eq!(
            super::decode::<LogOp>("op", "delete").unwrap(),
            LogOp::Delete
        );
        let error = super::decode::<LogOp>("op", "upsret")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("column op") && error.contains("upsret"),
            "{error}"
        );
        assert!("finished".parse::<RunStatus>().is_err());
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>().unwrap(), *status);
        }
    }
}
