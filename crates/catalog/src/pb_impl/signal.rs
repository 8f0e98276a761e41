//! `Signal` on the wire: the values of the protobuf enum `Signal` are the
//! signal's [`Signal::code`] (1 logs, 2 traces, 3 metrics), the code the
//! WAL, block footers and the Raft log use too, so there is no second
//! table to keep in step. Both types belong to other crates, so these are
//! functions, not `From` impls. The ingester's recent-data request
//! (`proto/ingester.proto`) carries the same enum.

use mira_core::ids::Signal;

use crate::error::CommandError;

/// The protobuf enum value of a signal.
pub fn to_pb(signal: Signal) -> i32 {
    i32::from(signal.code())
}

/// The signal a protobuf enum value names; `None` for `SIGNAL_UNSPECIFIED`
/// and values this build does not know.
pub fn from_pb(value: i32) -> Option<Signal> {
    u8::try_from(value).ok().and_then(Signal::from_code)
}

/// [`from_pb`] for a request field: an unknown value names the field.
pub fn parse(field: &str, value: i32) -> Result<Signal, CommandError> {
    from_pb(value).ok_or_else(|| CommandError::invalid(field, format!("unknown signal {value}")))
}

#[cfg(test)]
mod tests {
    use mira_proto::catalog as pb;

    use super::*;

    #[test]
    fn enum_values_are_the_signal_codes() {
        for s in Signal::ALL {
            let value = pb::Signal::try_from(to_pb(s)).expect("a value proto/catalog.proto declares");
            assert_eq!(
                value.as_str_name(),
                format!("SIGNAL_{}", s.as_str().to_ascii_uppercase())
            );
            assert_eq!(from_pb(to_pb(s)), Some(s));
        }
        assert_eq!(from_pb(pb::Signal::Unspecified as i32), None);
        assert_eq!(from_pb(4), None);
        assert_eq!(from_pb(-1), None);
        assert!(parse("signal", 9).is_err());
    }
}
