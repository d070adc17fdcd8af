//! locksvc
