//! What an XID means for the device, from NVIDIA's XID catalogue for Ampere and newer GPUs
//! (<https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>, the "Resolution
//! Bucket (Immediate Action)" column), and what the device's recovery action asks for (NVML's
//! `NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`, described in NVIDIA's GPU memory error management
//! guide, <https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html>).
//!
//! The recovery action is the driver's own verdict on the device; the catalogue is the fallback
//! where the driver gives none (older drivers, a lost device).

/// The catalogue's immediate action for an XID, as hearth groups it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidClass {
    /// RESTART_APP: the faulting application restarts; the device is fine (13, 31, 43's
    /// sibling faults, contained ECC 94…).
    Application,
    /// IGNORE and the like: nothing to do for the device (63 row remapping, 92 single-bit
    /// error rate, 43…).
    Informational,
    /// RESET_GPU: the device must be reset before it can be trusted (46, 62, 64, 95, 109, 119,
    /// 120, 140, 143, 155, 158…).
    ResetGpu,
    /// RESTART_BM / RESTART_VM: the host must be rebooted (79 fallen off the bus, 151).
    Reboot,
    /// WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, WORKFLOW_NVLINK5_ERR (48, 74, 144–150): "a GPU
    /// reset or node reboot is needed to clear this error", unless the driver's recovery action
    /// says nothing is needed (an uncorrectable error that containment kept to one process).
    Workflow,
    /// 154: the recovery action changed; the action itself says what to do.
    RecoveryChanged,
    /// Not in the catalogue (or "unused" there): the recovery action decides.
    Unlisted,
}

/// RESET_GPU in the catalogue.
const RESET_GPU: &[u64] = &[
    46, 62, 64, 95, 109, 110, 119, 120, 136, 140, 143, 155, 156, 158,
];
/// RESTART_BM and RESTART_VM.
const REBOOT: &[u64] = &[79, 151];
/// The WORKFLOW_* buckets whose text asks for a reset or a reboot.
const WORKFLOW: &[u64] = &[48, 74, 144, 145, 146, 147, 148, 149, 150];
/// RESTART_APP.
const APPLICATION: &[u64] = &[
    8, 11, 13, 25, 31, 32, 39, 40, 41, 60, 68, 69, 70, 71, 72, 73, 75, 76, 77, 80, 82, 83, 84, 85,
    86, 88, 89, 94, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 126, 127, 128, 129, 130, 131,
    132, 133, 134, 135, 139,
];
/// IGNORE, WORKFLOW_XID_45 (a teardown after another XID, which says its own), CHECK_UVM,
/// UPDATE_SWFW, CHECK_MECHANICALS: nothing that makes the device untrustworthy now.
const INFORMATIONAL: &[u64] = &[
    14, 37, 38, 43, 44, 45, 54, 63, 66, 67, 78, 92, 93, 106, 107, 108, 121, 137, 141, 152, 153,
    157, 159, 160, 161,
];

pub fn classify(xid: u64) -> XidClass {
    if RESET_GPU.contains(&xid) {
        XidClass::ResetGpu
    } else if REBOOT.contains(&xid) {
        XidClass::Reboot
    } else if WORKFLOW.contains(&xid) {
        XidClass::Workflow
    } else if APPLICATION.contains(&xid) {
        XidClass::Application
    } else if INFORMATIONAL.contains(&xid) {
        XidClass::Informational
    } else if xid == 154 {
        XidClass::RecoveryChanged
    } else {
        XidClass::Unlisted
    }
}

/// NVML's `nvmlDeviceGpuRecoveryAction_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAction {
    None,
    GpuReset,
    NodeReboot,
    /// Quiesce peer-to-peer traffic; the action is read again once drained.
    DrainP2p,
    DrainAndReset,
    RecoverImexDomain,
    BusReset,
    SystemReboot,
    /// A value this build does not know: treated as needing a reset.
    Other(u32),
}

impl RecoveryAction {
    pub fn from_raw(v: u32) -> RecoveryAction {
        match v {
            0 => RecoveryAction::None,
            1 => RecoveryAction::GpuReset,
            2 => RecoveryAction::NodeReboot,
            3 => RecoveryAction::DrainP2p,
            4 => RecoveryAction::DrainAndReset,
            5 => RecoveryAction::RecoverImexDomain,
            6 => RecoveryAction::BusReset,
            7 => RecoveryAction::SystemReboot,
            other => RecoveryAction::Other(other),
        }
    }

    pub fn describe(self) -> String {
        match self {
            RecoveryAction::None => "none".into(),
            RecoveryAction::GpuReset => "GPU reset required".into(),
            RecoveryAction::NodeReboot => "node reboot required".into(),
            RecoveryAction::DrainP2p => "drain peer-to-peer traffic".into(),
            RecoveryAction::DrainAndReset => "drain and reset".into(),
            RecoveryAction::RecoverImexDomain => "recover the IMEX domain".into(),
            RecoveryAction::BusReset => "PCIe bus reset required".into(),
            RecoveryAction::SystemReboot => "system reboot required".into(),
            RecoveryAction::Other(v) => format!("recovery action {v} (unknown to hearth)"),
        }
    }

    /// The device cannot be trusted until it is reset (or the host rebooted).
    pub fn needs_reset(self) -> bool {
        matches!(
            self,
            RecoveryAction::GpuReset
                | RecoveryAction::NodeReboot
                | RecoveryAction::DrainAndReset
                | RecoveryAction::BusReset
                | RecoveryAction::SystemReboot
                | RecoveryAction::Other(_)
        )
    }
}

/// What hearth does with a device after an XID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Unhealthy until `hearth uncordon`; its replicas move off. The reason, for the note.
    Evacuate(String),
    /// Multi-GPU replicas move off and none come; single-GPU ones stay.
    DrainP2p,
    /// The device stays in service; the reason, for the log.
    Stay(String),
}

/// The verdict on XID `xid` given the recovery action read after it (None: not readable).
pub fn verdict(xid: u64, recovery: Option<RecoveryAction>) -> Verdict {
    let class = classify(xid);
    match recovery {
        Some(a) if a.needs_reset() => {
            return Verdict::Evacuate(format!("XID {xid}, recovery action: {}", a.describe()))
        }
        Some(RecoveryAction::DrainP2p) => return Verdict::DrainP2p,
        _ => {}
    }
    let after = match recovery {
        Some(a) => format!("recovery action: {}", a.describe()),
        None => "recovery action unknown".to_string(),
    };
    match (class, recovery) {
        (XidClass::ResetGpu, _) => Verdict::Evacuate(format!("XID {xid} (GPU reset required)")),
        (XidClass::Reboot, _) => Verdict::Evacuate(format!("XID {xid} (reboot required)")),
        (XidClass::Workflow, None) => {
            Verdict::Evacuate(format!("XID {xid} (reset or reboot required; {after})"))
        }
        (XidClass::Workflow, Some(_)) => Verdict::Stay(format!("contained by the driver; {after}")),
        (XidClass::Application, _) => Verdict::Stay(format!("application error; {after}")),
        (XidClass::Informational, _) => Verdict::Stay(format!("informational; {after}")),
        (XidClass::RecoveryChanged, _) => Verdict::Stay(after),
        (XidClass::Unlisted, _) => Verdict::Stay(format!("not in NVIDIA's catalogue; {after}")),
    }
}

#[cfg(test)]
mod tests {
    use super::RecoveryAction as R;
    use super::*;

    #[test]
    fn the_issue_s_xids_with_their_recovery_actions() {
        // 94: contained ECC, only the faulting application is hit.
        assert!(matches!(verdict(94, Some(R::None)), Verdict::Stay(_)));
        assert!(matches!(verdict(94, None), Verdict::Stay(_)));
        assert!(matches!(
            verdict(94, Some(R::GpuReset)),
            Verdict::Evacuate(_)
        ));
        // 63: a row remapping is pending; future work is unaffected.
        assert!(matches!(verdict(63, Some(R::None)), Verdict::Stay(_)));
        assert!(matches!(verdict(63, None), Verdict::Stay(_)));
        // 92: a rate warning.
        assert!(matches!(verdict(92, None), Verdict::Stay(_)));
        // 48: a reset or reboot unless the driver says containment held.
        assert!(matches!(verdict(48, None), Verdict::Evacuate(_)));
        assert!(matches!(verdict(48, Some(R::None)), Verdict::Stay(_)));
        assert!(matches!(
            verdict(48, Some(R::DrainAndReset)),
            Verdict::Evacuate(_)
        ));
        // 79: fallen off the bus; nothing can be read, the catalogue says reboot.
        assert_eq!(
            verdict(79, None),
            Verdict::Evacuate("XID 79 (reboot required)".into())
        );
        // 154: the recovery action is the message.
        assert!(matches!(verdict(154, Some(R::None)), Verdict::Stay(_)));
        assert_eq!(
            verdict(154, Some(R::NodeReboot)),
            Verdict::Evacuate("XID 154, recovery action: node reboot required".into())
        );
        assert_eq!(verdict(154, Some(R::DrainP2p)), Verdict::DrainP2p);
        assert!(matches!(verdict(154, None), Verdict::Stay(_)));
    }

    #[test]
    fn an_unlisted_xid_that_needs_a_reset_is_acted_on_through_the_recovery_action() {
        assert!(matches!(verdict(999, None), Verdict::Stay(_)));
        assert!(matches!(verdict(999, Some(R::None)), Verdict::Stay(_)));
        assert!(matches!(
            verdict(999, Some(R::GpuReset)),
            Verdict::Evacuate(_)
        ));
        assert!(matches!(
            verdict(999, Some(R::Other(42))),
            Verdict::Evacuate(_)
        ));
        assert_eq!(R::from_raw(42), R::Other(42));
    }

    #[test]
    fn the_catalogue_lists_each_xid_once() {
        let all = [RESET_GPU, REBOOT, WORKFLOW, APPLICATION, INFORMATIONAL];
        for (i, a) in all.iter().enumerate() {
            for x in a.iter() {
                for b in all.iter().skip(i + 1) {
                    assert!(!b.contains(x), "XID {x} in two classes");
                }
            }
        }
        for x in [13, 31, 43, 45, 68, 109, 94, 95, 119, 120, 74, 64, 63, 92] {
            let c = classify(x);
            let expected = match x {
                13 | 31 | 68 | 94 => XidClass::Application,
                43 | 45 | 63 | 92 => XidClass::Informational,
                74 => XidClass::Workflow,
                _ => XidClass::ResetGpu,
            };
            assert_eq!(c, expected, "XID {x}");
        }
    }
}
