//! The 16 workload segments of the paper (§2.3, §5.1; adopted by the authors from Sizeless).
//!
//! Each segment is a parametric model: given its payload parameter (matrix dimension, image
//! dimension, JSON size, file size, table size, float-operation count, sleep duration) it yields
//! the per-request CPU demand, memory working set (base + per in-flight request), I/O and network
//! bytes, non-CPU latency, cold-start time and noise. The numbers are calibrated so that the
//! paper's default payloads need 1–130 ms of CPU per request on one core, typical of the
//! Node.js/Python functions of the artifact, and so that the instability scenarios of §2.3 change
//! the demand by the factors the paper's payload changes imply.

use serde::{Deserialize, Serialize};

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The 16 workload segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// Floating-point computation; payload = number of operations.
    FloatOps,
    /// Matrix multiplication (ML model serving); payload = matrix dimension n (n×n).
    MatrixMultiply,
    /// Image resize; payload = image dimension in pixels (d×d).
    ImageResize,
    /// Image rotate; payload = image dimension in pixels.
    ImageRotate,
    /// Image compress (JPEG re-encode); payload = image dimension in pixels.
    ImageCompress,
    /// JSON → YAML conversion; payload = JSON size in bytes.
    JsonToYaml,
    /// Compress a file; payload = file size in KiB.
    Compress,
    /// Decompress a file; payload = file size in KiB.
    Decompress,
    /// Sleep (waits on an external dependency); payload = sleep duration in ms.
    Sleep,
    /// Read a local file; payload = file size in KiB.
    FileRead,
    /// Write a local file (with fsync); payload = file size in KiB.
    FileWrite,
    /// Read an object from an object store (S3-like); payload = object size in KiB.
    ObjectStoreRead,
    /// Write an object to an object store; payload = object size in KiB.
    ObjectStoreWrite,
    /// Stream an object from an object store in chunks; payload = object size in KiB.
    ObjectStoreStream,
    /// Key-value/database read (table scan); payload = table size in items.
    KeyValueRead,
    /// Key-value/database write (insert + index update); payload = table size in items.
    KeyValueWrite,
}

/// The payload families; the instability scenarios change the payload of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayloadFamily {
    /// Number of floating-point operations.
    FloatOps,
    /// Matrix dimension.
    MatrixDimension,
    /// Image dimension (pixels per side).
    ImageDimension,
    /// JSON document size (bytes).
    JsonSize,
    /// File/object size (KiB).
    FileSize,
    /// Table size (items).
    TableSize,
    /// Sleep duration (ms).
    SleepMs,
}

/// Per-request cost of one segment at a given payload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SegmentCost {
    /// CPU demand in core-seconds per request.
    pub cpu_seconds: f64,
    /// Cores one request can use at most (1 = single-threaded).
    pub parallelism: f64,
    /// Resident memory of the segment's code/libraries, bytes (counted once per replica).
    pub mem_base_bytes: f64,
    /// Extra working set per in-flight request, bytes.
    pub mem_per_request_bytes: f64,
    /// Disk bytes read + written per request.
    pub io_bytes: f64,
    /// Network bytes sent + received per request (besides the request itself).
    pub net_bytes: f64,
    /// Time per request spent off-CPU (disk, network, sleep) at no contention, seconds.
    pub wait_seconds: f64,
    /// Time to become ready after a (re)start, seconds (library/model loading).
    pub cold_start_seconds: f64,
    /// Coefficient of variation of the per-request demand (noise).
    pub noise_cv: f64,
}

impl SegmentKind {
    /// All 16 segments, in a fixed order (the generator samples from this pool).
    pub const ALL: [SegmentKind; 16] = [
        SegmentKind::FloatOps,
        SegmentKind::MatrixMultiply,
        SegmentKind::ImageResize,
        SegmentKind::ImageRotate,
        SegmentKind::ImageCompress,
        SegmentKind::JsonToYaml,
        SegmentKind::Compress,
        SegmentKind::Decompress,
        SegmentKind::Sleep,
        SegmentKind::FileRead,
        SegmentKind::FileWrite,
        SegmentKind::ObjectStoreRead,
        SegmentKind::ObjectStoreWrite,
        SegmentKind::ObjectStoreStream,
        SegmentKind::KeyValueRead,
        SegmentKind::KeyValueWrite,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            SegmentKind::FloatOps => "float_ops",
            SegmentKind::MatrixMultiply => "matrix_multiply",
            SegmentKind::ImageResize => "image_resize",
            SegmentKind::ImageRotate => "image_rotate",
            SegmentKind::ImageCompress => "image_compress",
            SegmentKind::JsonToYaml => "json_to_yaml",
            SegmentKind::Compress => "compress",
            SegmentKind::Decompress => "decompress",
            SegmentKind::Sleep => "sleep",
            SegmentKind::FileRead => "file_read",
            SegmentKind::FileWrite => "file_write",
            SegmentKind::ObjectStoreRead => "object_store_read",
            SegmentKind::ObjectStoreWrite => "object_store_write",
            SegmentKind::ObjectStoreStream => "object_store_stream",
            SegmentKind::KeyValueRead => "key_value_read",
            SegmentKind::KeyValueWrite => "key_value_write",
        }
    }

    /// The payload family of this segment.
    pub fn family(self) -> PayloadFamily {
        use SegmentKind::*;
        match self {
            FloatOps => PayloadFamily::FloatOps,
            MatrixMultiply => PayloadFamily::MatrixDimension,
            ImageResize | ImageRotate | ImageCompress => PayloadFamily::ImageDimension,
            JsonToYaml => PayloadFamily::JsonSize,
            Compress | Decompress | FileRead | FileWrite | ObjectStoreRead | ObjectStoreWrite
            | ObjectStoreStream => PayloadFamily::FileSize,
            Sleep => PayloadFamily::SleepMs,
            KeyValueRead | KeyValueWrite => PayloadFamily::TableSize,
        }
    }

    /// Default payload (the "before" value of the paper's §2.3 scenarios).
    pub fn default_payload(self) -> f64 {
        self.family().before()[0]
    }

    /// Per-request cost at `payload` (units per [`PayloadFamily`]). Non-finite or negative
    /// payloads are treated as 0.
    pub fn cost(self, payload: f64) -> SegmentCost {
        let x = if payload.is_finite() && payload > 0.0 {
            payload
        } else {
            0.0
        };
        use SegmentKind::*;
        // (cpu_s, par, base MiB, per-request bytes, io bytes, net bytes, wait s, cold s, cv)
        let (cpu, par, base_mib, per_req, io, net, wait, cold, cv) = match self {
            FloatOps => (
                1e-3 + 1.0e-9 * x,
                1.0,
                40.0,
                2.0 * MIB,
                0.0,
                0.0,
                0.0,
                1.0,
                0.08,
            ),
            MatrixMultiply => {
                let n = x;
                (
                    1e-3 + 4.0e-8 * n * n * n,
                    2.0,
                    180.0,
                    4.0 * MIB + 3.0 * n * n * 8.0 * 4.0,
                    0.0,
                    n * n * 8.0,
                    0.0,
                    6.0,
                    0.10,
                )
            }
            ImageResize => (
                2e-3 + 5.0e-6 * x * x,
                1.0,
                90.0,
                3.0 * MIB + x * x * 4.0 * 6.0,
                0.0,
                x * x * 3.0,
                0.002,
                3.0,
                0.12,
            ),
            ImageRotate => (
                1e-3 + 3.0e-6 * x * x,
                1.0,
                90.0,
                3.0 * MIB + x * x * 4.0 * 4.0,
                0.0,
                x * x * 3.0,
                0.002,
                3.0,
                0.10,
            ),
            ImageCompress => (
                3e-3 + 8.0e-6 * x * x,
                1.0,
                95.0,
                3.0 * MIB + x * x * 4.0 * 8.0,
                0.0,
                x * x * 2.0,
                0.002,
                3.0,
                0.15,
            ),
            JsonToYaml => (
                5e-4 + 2.0e-6 * x,
                1.0,
                35.0,
                MIB + 60.0 * x,
                0.0,
                2.0 * x,
                0.0,
                1.0,
                0.15,
            ),
            Compress => (
                1e-3 + 1.0e-4 * x,
                1.0,
                45.0,
                2.0 * MIB + 2.5 * x * KIB,
                1.5 * x * KIB,
                0.0,
                0.001 + x * KIB / (150.0 * MIB),
                1.5,
                0.12,
            ),
            Decompress => (
                1e-3 + 4.0e-5 * x,
                1.0,
                45.0,
                2.0 * MIB + 3.0 * x * KIB,
                1.5 * x * KIB,
                0.0,
                0.001 + x * KIB / (150.0 * MIB),
                1.5,
                0.12,
            ),
            Sleep => (2e-4, 1.0, 30.0, 0.5 * MIB, 0.0, 0.0, x / 1000.0, 1.0, 0.05),
            FileRead => (
                5e-4 + 5.0e-6 * x,
                1.0,
                35.0,
                MIB + x * KIB,
                x * KIB,
                0.0,
                0.001 + x * KIB / (200.0 * MIB),
                1.0,
                0.20,
            ),
            FileWrite => (
                8e-4 + 8.0e-6 * x,
                1.0,
                35.0,
                MIB + x * KIB,
                x * KIB,
                0.0,
                0.003 + x * KIB / (120.0 * MIB),
                1.0,
                0.25,
            ),
            ObjectStoreRead => (
                1e-3 + 1.0e-5 * x,
                1.0,
                50.0,
                1.5 * MIB + x * KIB,
                0.0,
                x * KIB,
                0.015 + x * KIB / (60.0 * MIB),
                1.5,
                0.25,
            ),
            ObjectStoreWrite => (
                1.2e-3 + 1.2e-5 * x,
                1.0,
                50.0,
                1.5 * MIB + x * KIB,
                0.0,
                x * KIB,
                0.025 + x * KIB / (40.0 * MIB),
                1.5,
                0.25,
            ),
            ObjectStoreStream => (
                2e-3 + 2.0e-5 * x,
                1.0,
                50.0,
                1.5 * MIB + 64.0 * KIB,
                0.0,
                x * KIB,
                0.010 + x * KIB / (80.0 * MIB),
                1.5,
                0.20,
            ),
            KeyValueRead => (
                5e-4 + 2.0e-6 * x,
                1.0,
                40.0,
                MIB + 120.0 * x,
                0.0,
                100.0 * x,
                0.002,
                1.2,
                0.15,
            ),
            KeyValueWrite => (
                5e-4 + 5.0e-7 * x,
                1.0,
                40.0,
                MIB + 40.0 * x,
                0.0,
                KIB,
                0.004,
                1.2,
                0.15,
            ),
        };
        SegmentCost {
            cpu_seconds: cpu,
            parallelism: par,
            mem_base_bytes: base_mib * MIB,
            mem_per_request_bytes: per_req,
            io_bytes: io,
            net_bytes: net,
            wait_seconds: wait,
            cold_start_seconds: cold,
            noise_cv: cv,
        }
    }
}

impl PayloadFamily {
    /// Payload values before an instability scenario (paper §2.3).
    pub fn before(self) -> &'static [f64] {
        match self {
            PayloadFamily::FloatOps => &[1.0e8],
            PayloadFamily::MatrixDimension => &[50.0],
            PayloadFamily::ImageDimension => &[40.0],
            PayloadFamily::JsonSize => &[250.0, 500.0, 1024.0],
            PayloadFamily::FileSize => &[128.0, 256.0, 384.0],
            PayloadFamily::TableSize => &[1024.0],
            PayloadFamily::SleepMs => &[50.0],
        }
    }

    /// Payload values after an instability scenario (paper §2.3). The paper prints "20^8"
    /// operations for the float scenario; we read it as 2×10^8 (20^8 would be 256× more work,
    /// far outside the other scenarios' 2–10× range).
    pub fn after(self) -> &'static [f64] {
        match self {
            PayloadFamily::FloatOps => &[2.0e8],
            PayloadFamily::MatrixDimension => &[150.0],
            PayloadFamily::ImageDimension => &[160.0],
            PayloadFamily::JsonSize => &[2048.0, 3072.0, 5120.0],
            PayloadFamily::FileSize => &[512.0, 768.0, 1024.0],
            PayloadFamily::TableSize => &[10240.0],
            PayloadFamily::SleepMs => &[200.0],
        }
    }

    /// Unit of the payload parameter.
    pub fn unit(self) -> &'static str {
        match self {
            PayloadFamily::FloatOps => "operations",
            PayloadFamily::MatrixDimension => "n (n×n matrix)",
            PayloadFamily::ImageDimension => "pixels per side",
            PayloadFamily::JsonSize => "bytes",
            PayloadFamily::FileSize => "KiB",
            PayloadFamily::TableSize => "items",
            PayloadFamily::SleepMs => "ms",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_increases_with_payload_for_every_segment() {
        for kind in SegmentKind::ALL {
            let fam = kind.family();
            let lo = kind.cost(fam.before()[0]);
            let hi = kind.cost(fam.after()[fam.after().len() - 1]);
            assert!(
                hi.cpu_seconds > lo.cpu_seconds || hi.wait_seconds > lo.wait_seconds,
                "{} demand must grow with payload",
                kind.name()
            );
            assert!(lo.cpu_seconds > 0.0 && lo.cold_start_seconds > 0.0);
        }
    }

    #[test]
    fn default_payload_demand_is_in_plausible_range() {
        for kind in SegmentKind::ALL {
            let c = kind.cost(kind.default_payload());
            assert!(
                c.cpu_seconds >= 1e-4 && c.cpu_seconds <= 0.2,
                "{}: {}",
                kind.name(),
                c.cpu_seconds
            );
            assert!(c.mem_base_bytes >= 16.0 * MIB);
        }
    }

    #[test]
    fn invalid_payload_is_zero() {
        let c = SegmentKind::FloatOps.cost(f64::NAN);
        assert_eq!(c.cpu_seconds, 1e-3);
    }

    #[test]
    fn names_unique() {
        let mut names: Vec<_> = SegmentKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 16);
    }
}
