//! UMP's configuration (`ump_init`): ring sizes, the channel limit and
//! the multicast outbuf, from the caller or the environment. No I/O but
//! reading the environment; no threads.

use thiserror::Error;

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Configuration (`ump_init`).
#[derive(Debug, Clone)]
pub struct Config {
    /// Ring bytes per direction, shared-memory channels.
    pub shm_buffer: usize,
    /// Ring bytes per direction, MEMORY CHANNEL channels.
    pub mc_buffer: usize,
    /// Channels this process may have open (buffers are allocated as
    /// channels open, up to this).
    pub max_channels: usize,
    /// Bytes of this process's multicast outbuf (a multiple of 8 KiB).
    pub outbuf: usize,
    /// MEMORY CHANNEL: pieces of a message of at least this many bytes go
    /// into the other side's ring by the adapter's transmit DMA engine,
    /// when it has one (0: never).
    pub dma_threshold: usize,
    /// MEMORY CHANNEL with DMA: bytes of the process's DMA source area
    /// kept for the caller beyond the rings' copies ([`crate::dma_spare`]):
    /// memory that is both a DMA source and a landing place for a region
    /// (MPI's `MPI_Alloc_mem`). A multiple of 8 KiB, at most
    /// [`DMA_SPARE_MAX`]; 0: none.
    pub dma_spare: usize,
    /// MEMORY CHANNEL with DMA: channels whose writer keeps its copy of
    /// the ring in the DMA source area, and so may send by DMA (a slot of
    /// [`Config::mc_buffer`] bytes each; later channels keep their copy in
    /// plain memory and send by stores). `None`: [`Config::max_channels`].
    /// MPI sets it to the ranks on other guests.
    pub dma_slots: Option<usize>,
}

/// Largest [`Config::dma_spare`]: half of the biggest source area imcd
/// gives a process (16 MiB), so the rings' copies keep the other half.
pub const DMA_SPARE_MAX: usize = 8 << 20;

/// Largest ring: what one MEMORY CHANNEL region or shm file may hold.
pub const MAX_BUFFER: usize = 64 << 20;

/// Default outbuf bytes (`UMP_OUTBUF`).
pub const OUTBUF_DEFAULT: usize = 1 << 20;

/// Default DMA threshold (`UMP_DMA_THRESHOLD`), from `ump-tool bench`
/// runs with and without DMA (docs/ump.md, "Measuring").
pub const DMA_THRESHOLD_DEFAULT: usize = 1024;

impl Default for Config {
    fn default() -> Self {
        // The paper's non-blocking runs: 256 KiB (shared memory), 32 KiB
        // (MEMORY CHANNEL).
        Config {
            shm_buffer: 256 << 10,
            mc_buffer: 32 << 10,
            max_channels: 64,
            outbuf: OUTBUF_DEFAULT,
            dma_threshold: DMA_THRESHOLD_DEFAULT,
            dma_spare: 0,
            dma_slots: None,
        }
    }
}

impl Config {
    /// From the environment: `UMP_SHM_BUFFER`, `UMP_MC_BUFFER`,
    /// `UMP_OUTBUF`, `UMP_DMA_THRESHOLD`, `UMP_DMA_SPARE` (bytes, or with a K/M suffix),
    /// `UMP_MAX_CHANNELS`, `UMP_DMA_SLOTS`.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`Config::from_env`], with the variables from `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let size = |name: &str, v: &mut usize| -> Result<(), ConfigError> {
            if let Some(s) = var(name) {
                *v = parse_size(&s).ok_or_else(|| ConfigError(format!("{name}={s:?}: a size like 65536 or 64K")))?;
            }
            Ok(())
        };
        size("UMP_SHM_BUFFER", &mut c.shm_buffer)?;
        size("UMP_MC_BUFFER", &mut c.mc_buffer)?;
        size("UMP_OUTBUF", &mut c.outbuf)?;
        size("UMP_DMA_THRESHOLD", &mut c.dma_threshold)?;
        size("UMP_DMA_SPARE", &mut c.dma_spare)?;
        if let Some(s) = var("UMP_MAX_CHANNELS") {
            c.max_channels = s.parse().map_err(|_| ConfigError(format!("UMP_MAX_CHANNELS={s:?}")))?;
        }
        if let Some(s) = var("UMP_DMA_SLOTS") {
            c.dma_slots =
                Some(s.parse().map_err(|_| ConfigError(format!("UMP_DMA_SLOTS={s:?}: a number of channels")))?);
        }
        c.check()?;
        Ok(c)
    }

    /// Rejects sizes that cannot work.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (what, v) in [("shared-memory", self.shm_buffer), ("MEMORY CHANNEL", self.mc_buffer)] {
            if !(4096..=MAX_BUFFER).contains(&v) || v % 8 != 0 {
                return Err(ConfigError(format!(
                    "{what} buffer of {v} bytes: 4 KiB to {} MiB, a multiple of 8",
                    MAX_BUFFER >> 20
                )));
            }
        }
        if !(8192..=MAX_BUFFER).contains(&self.outbuf) || self.outbuf % 8192 != 0 {
            return Err(ConfigError(format!(
                "outbuf of {} bytes: 8 KiB to {} MiB, a multiple of 8 KiB (UMP_OUTBUF)",
                self.outbuf,
                MAX_BUFFER >> 20
            )));
        }
        if self.dma_spare > DMA_SPARE_MAX || self.dma_spare % 8192 != 0 {
            return Err(ConfigError(format!(
                "DMA spare of {} bytes: 0 to {} MiB, a multiple of 8 KiB (UMP_DMA_SPARE)",
                self.dma_spare,
                DMA_SPARE_MAX >> 20
            )));
        }
        if self.max_channels == 0 {
            return Err(ConfigError("max_channels must be at least 1".into()));
        }
        Ok(())
    }
}

/// A size in bytes, or with a K or M suffix (`64K`, `1M`).
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (n, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    n.parse::<usize>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_bad_ones_are_refused() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| pairs.iter().find(|p| p.0 == n).map(|p| p.1.to_string())
        };
        let c =
            Config::from_vars(vars(&[("UMP_SHM_BUFFER", "64K"), ("UMP_MC_BUFFER", "1M"), ("UMP_MAX_CHANNELS", "3")]))
                .unwrap();
        assert_eq!((c.shm_buffer, c.mc_buffer, c.max_channels), (64 << 10, 1 << 20, 3));
        assert_eq!(c.dma_threshold, DMA_THRESHOLD_DEFAULT);
        let c = Config::from_vars(vars(&[("UMP_DMA_THRESHOLD", "0")])).unwrap();
        assert_eq!(c.dma_threshold, 0, "0 turns DMA off");
        assert!(Config::from_vars(vars(&[("UMP_DMA_THRESHOLD", "big")])).is_err());
        assert!(Config::from_vars(vars(&[("UMP_SHM_BUFFER", "lots")])).unwrap_err().0.contains("UMP_SHM_BUFFER"));
        assert!(Config::from_vars(vars(&[("UMP_MC_BUFFER", "100")])).is_err(), "below 4 KiB");
        assert!(Config::from_vars(vars(&[("UMP_OUTBUF", "12K")])).is_err(), "not whole 8 KiB");
        assert!(Config::from_vars(vars(&[("UMP_MAX_CHANNELS", "0")])).is_err());
        assert_eq!(Config::from_vars(vars(&[("UMP_DMA_SPARE", "4M")])).unwrap().dma_spare, 4 << 20);
        assert_eq!(Config::default().dma_slots, None);
        assert_eq!(Config::from_vars(vars(&[("UMP_DMA_SLOTS", "3")])).unwrap().dma_slots, Some(3));
        assert!(Config::from_vars(vars(&[("UMP_DMA_SLOTS", "x")])).unwrap_err().0.contains("UMP_DMA_SLOTS"));
        assert!(Config::from_vars(vars(&[("UMP_DMA_SPARE", "9M")])).unwrap_err().0.contains("UMP_DMA_SPARE"));
        assert!(Config::from_vars(vars(&[("UMP_DMA_SPARE", "12K")])).is_err(), "not whole 8 KiB");
        assert!(Config::from_vars(vars(&[("UMP_SHM_BUFFER", "99999999999999999999K")])).is_err(), "overflow");
    }
}
