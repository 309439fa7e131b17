//! Enums spelled as a closed set of words — a setting's choices, a stored column's values, a
//! wire field's — declared with [`text_enum!`](crate::enums::text_enum): the one mechanism the
//! crate has for them. A leaf: it uses nothing of the crate, so config and the store can both
//! use it.

/// Declares an enum spelled as text: `Name("what it is") { Variant => "text", … }`. It gets
/// one spelling per variant for `as_str`, `Display`, `FromStr`, serde and the OpenAPI schema;
/// `parse` (unknown text is `None`, never a default); `ALL`, every variant in declaration
/// order; and for unknown text an [`UnknownText`] error that names what was expected and
/// lists the choices (also what serde says of a bad value). More derives (`PartialOrd`,
/// `Ord`, `Default`) go in the attributes.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        // `tt`, not `literal`: a `literal` fragment reaches derive macros wrapped in an
        // invisible group, which utoipa does not look into (its schema would spell the
        // variant's Rust name).
        $name:ident ($what:literal) {
            $($(#[$vmeta:meta])* $variant:ident => $text:tt),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(
            Debug,
            Clone,
            Copy,
            PartialEq,
            Eq,
            Hash,
            serde::Deserialize,
            serde::Serialize,
            strum::Display,
            strum::IntoStaticStr,
            strum::VariantArray,
            utoipa::ToSchema,
        )]
        #[serde(try_from = "String")]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] #[strum(serialize = $text)] $variant),*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            pub fn as_str(self) -> &'static str {
                self.into()
            }

            /// The variant spelled `text`; `None` for any other text.
            pub fn parse(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::enums::UnknownText;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                Self::parse(text).ok_or_else(|| $crate::enums::UnknownText {
                    what: $what,
                    text: text.to_string(),
                    choices: &[$($text),*],
                })
            }
        }

        impl TryFrom<String> for $name {
            type Error = $crate::enums::UnknownText;

            fn try_from(text: String) -> Result<Self, $crate::enums::UnknownText> {
                text.parse()
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }
    };
}

pub(crate) use text_enum;

/// Text that names no variant of a text enum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {text:?} is unknown; expected one of {}", choices.join(", "))]
pub struct UnknownText {
    /// What the text was to name, e.g. "memory kind".
    pub what: &'static str,
    pub text: String,
    pub choices: &'static [&'static str],
}

#[cfg(test)]
mod tests {
    text_enum! {
        /// A test enum.
        #[derive(PartialOrd, Ord)]
        Colour("colour") { Red => "red", DeepBlue => "deep_blue" }
    }

    #[test]
    fn every_spelling_is_the_declared_one_and_unknown_text_lists_the_choices() {
        assert_eq!(Colour::ALL, &[Colour::Red, Colour::DeepBlue]);
        for colour in Colour::ALL {
            assert_eq!(colour.as_str().parse::<Colour>().unwrap(), *colour);
            assert_eq!(colour.to_string(), colour.as_str());
            let json = serde_json::to_string(colour).unwrap();
            assert_eq!(json, format!("\"{}\"", colour.as_str()));
            assert_eq!(serde_json::from_str::<Colour>(&json).unwrap(), *colour);
        }
        assert_eq!(Colour::parse("DeepBlue"), None);
        assert_eq!(Colour::parse("Red"), None, "the spelling is exact");
        let error = "green".parse::<Colour>().unwrap_err().to_string();
        assert_eq!(
            error,
            "colour \"green\" is unknown; expected one of red, deep_blue"
        );
        let error = serde_json::from_str::<Colour>("\"green\"")
            .unwrap_err()
            .to_string();
        assert!(error.contains("expected one of red, deep_blue"), "{error}");
        assert!(Colour::Red < Colour::DeepBlue);
    }
}
