//! Enums stored as text columns. `text_enum!` gives each a fixed text per variant, `parse`
//! (unknown text is `None`, never a default), `FromStr`, `Display` and serde in the same
//! spelling; `decode` turns a column's text into the enum or a decode error naming the column,
//! so a corrupt row fails loudly instead of being read as some default.

/// Declares an enum stored as text: `Name { Variant => "text", … }`.
macro_rules! text_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vmeta])* $variant),* }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }

            pub fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)* _ => None }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::store::text_enum::UnknownText;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Self::parse(text).ok_or_else(|| $crate::store::text_enum::UnknownText {
                    what: stringify!($name),
                    text: text.to_string(),
                })
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Text that names no variant of a text enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {text:?}")]
pub struct UnknownText {
    pub what: &'static str,
    pub text: String,
}

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
