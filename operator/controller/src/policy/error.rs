//! What can go wrong in a reconcile of one policy, each with a stable label for
//! `splice_reconcile_total{result}`.

use super::render::RenderError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("this replica is not the leader")]
    NotLeader,
    #[error("the webhook CA is not loaded yet")]
    NoCertificate,
    #[error(transparent)]
    Render(#[from] RenderError),
    #[error("writing MutatingWebhookConfiguration {name}: {source}")]
    Apply { name: String, source: kube::Error },
    #[error("removing MutatingWebhookConfiguration {name}: {source}")]
    Remove { name: String, source: kube::Error },
    #[error("reading MutatingWebhookConfiguration {name}: {source}")]
    Read { name: String, source: kube::Error },
    #[error("writing the status of policy {name}: {source}")]
    Status { name: String, source: kube::Error },
    /// `message` is the API's answer, cut short: a refused admission policy comes back with its
    /// whole CEL quoted, more than a condition message may hold.
    #[error("{action} {kind} {name}: {message}")]
    InTree {
        action: &'static str,
        kind: &'static str,
        name: String,
        message: String,
    },
}

impl Error {
    /// Stable label for `splice_reconcile_total{result}`.
    pub fn label(&self) -> &'static str {
        match self {
            Error::NotLeader => "not_leader",
            Error::NoCertificate => "no_certificate",
            Error::Render(e) => e.label(),
            Error::Apply { .. } => "apply_error",
            Error::Remove { .. } => "remove_error",
            Error::Read { .. } => "read_error",
            Error::Status { .. } => "status_error",
            Error::InTree { .. } => "in_tree_error",
        }
    }
}

/// Events notes are limited to 1 kB.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max.saturating_sub(1);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_character_boundaries() {
        let s = "é".repeat(600);
        let t = truncate(s, 1000);
        assert!(t.len() <= 1000 + '…'.len_utf8());
        assert!(t.ends_with('…'));
        assert_eq!(truncate("short".into(), 1000), "short");
    }
}
