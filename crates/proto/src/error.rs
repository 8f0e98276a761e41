//! The one mapping from what went wrong to an HTTP status and a gRPC code
//! (after quickwit's `ServiceErrorCode`). Every role's error type says its
//! [`ErrorCode`] through [`ServiceError`]; nothing else maps errors to
//! statuses. An [`ErrorCode::Internal`] answer carries no detail: the
//! detail is logged where the error is answered.

/// What kind of failure an error is, independent of the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The request is malformed; the message names the problem.
    BadRequest,
    /// The body's content type is neither protobuf nor JSON.
    UnsupportedMediaType,
    /// What was asked for does not exist.
    NotFound,
    /// Something different already exists under this id.
    AlreadyExists,
    /// Valid, but the current state does not allow it (a lease held by
    /// someone else, a block no longer live, a fenced epoch).
    Conflict,
    /// The request carries no credential, or one that is not valid
    /// (unknown, expired, revoked); the message never says which.
    Unauthenticated,
    /// The caller may not do this (a Raft message from a member of
    /// another cluster, a tenant or scope its credential does not grant).
    Forbidden,
    /// The request itself is over a size limit.
    TooLarge,
    /// A valid query over a configured limit (range, blocks, series).
    TooBig,
    /// A deadline passed: the client was too slow sending its request, or
    /// an operation did not finish in time.
    Timeout,
    /// The server's own bound on the work passed: a query ran longer than
    /// the query timeout. Retrying the same work will likely time out again.
    DeadlineExceeded,
    /// No room now; retry later.
    Overloaded,
    /// Not serving now (stopping, not ready, a dependency down); retry.
    Unavailable,
    /// A fault of ours (a bug, corrupt stored data, an I/O error).
    Internal,
}

impl ErrorCode {
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::Timeout => 408,
            ErrorCode::DeadlineExceeded => 504,
            ErrorCode::AlreadyExists | ErrorCode::Conflict => 409,
            ErrorCode::TooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::TooBig => 422,
            ErrorCode::Overloaded => 429,
            ErrorCode::Internal => 500,
            ErrorCode::Unavailable => 503,
        }
    }

    pub fn grpc_code(self) -> tonic::Code {
        match self {
            ErrorCode::BadRequest | ErrorCode::UnsupportedMediaType => tonic::Code::InvalidArgument,
            ErrorCode::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorCode::Forbidden => tonic::Code::PermissionDenied,
            ErrorCode::NotFound => tonic::Code::NotFound,
            ErrorCode::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorCode::Conflict => tonic::Code::FailedPrecondition,
            ErrorCode::TooLarge | ErrorCode::Overloaded => tonic::Code::ResourceExhausted,
            ErrorCode::TooBig => tonic::Code::OutOfRange,
            ErrorCode::Timeout | ErrorCode::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            ErrorCode::Unavailable => tonic::Code::Unavailable,
            ErrorCode::Internal => tonic::Code::Internal,
        }
    }

    /// True for faults of ours: answered without detail, logged instead.
    pub fn is_internal(self) -> bool {
        self == ErrorCode::Internal
    }
}

/// An error a service answers with: its kind decides the status.
pub trait ServiceError: std::error::Error {
    fn error_code(&self) -> ErrorCode;

    /// The gRPC status for this error: the message for the caller's faults,
    /// a generic one (the detail logged here) for ours.
    fn to_status(&self) -> tonic::Status {
        let code = self.error_code();
        tonic::Status::new(code.grpc_code(), self.public_message())
    }

    /// What the caller is told: the error itself for the caller's faults,
    /// a generic line for ours (whose detail is logged here, once).
    fn public_message(&self) -> String {
        if self.error_code().is_internal() {
            tracing::error!(target: "mira::error", error = %self, "internal error answered");
            return "internal error (the detail is in the server's log)".to_owned();
        }
        self.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every code; the match makes a new variant fail to compile until it
    /// is listed here too.
    fn all() -> Vec<ErrorCode> {
        let all = vec![
            ErrorCode::BadRequest,
            ErrorCode::UnsupportedMediaType,
            ErrorCode::NotFound,
            ErrorCode::AlreadyExists,
            ErrorCode::Conflict,
            ErrorCode::Unauthenticated,
            ErrorCode::Forbidden,
            ErrorCode::TooLarge,
            ErrorCode::TooBig,
            ErrorCode::Timeout,
            ErrorCode::DeadlineExceeded,
            ErrorCode::Overloaded,
            ErrorCode::Unavailable,
            ErrorCode::Internal,
        ];
        for c in &all {
            match c {
                ErrorCode::BadRequest
                | ErrorCode::UnsupportedMediaType
                | ErrorCode::NotFound
                | ErrorCode::AlreadyExists
                | ErrorCode::Conflict
                | ErrorCode::Unauthenticated
                | ErrorCode::Forbidden
                | ErrorCode::TooLarge
                | ErrorCode::TooBig
                | ErrorCode::Timeout
                | ErrorCode::DeadlineExceeded
                | ErrorCode::Overloaded
                | ErrorCode::Unavailable
                | ErrorCode::Internal => {}
            }
        }
        all
    }

    #[test]
    fn every_code_maps_to_a_distinct_meaning() {
        let mut seen = std::collections::HashSet::new();
        for c in all() {
            let status = c.http_status();
            assert!((400..600).contains(&status), "{c:?}");
            // Only faults of ours are 5xx-but-not-retryable.
            assert_eq!(c.is_internal(), status == 500, "{c:?}");
            assert_eq!(
                matches!(c.grpc_code(), tonic::Code::Unavailable),
                status == 503,
                "{c:?}"
            );
            // No two codes answer alike on both transports.
            assert!(
                seen.insert((status, c.grpc_code() as i32)),
                "{c:?} answers like another code"
            );
        }
        assert_eq!(
            (ErrorCode::Forbidden.http_status(), ErrorCode::Forbidden.grpc_code()),
            (403, tonic::Code::PermissionDenied)
        );
    }
}
