//! Time spent in attention during one forward pass, for profiles (`EngineConfig::profile`).
//!
//! On the CPU, wall time around each call: candle's CPU operations finish before they return.
//! On CUDA, a pair of timing events recorded on the stream around each call and read after the
//! step has waited for the device anyway, so timing adds no synchronisation of its own.

use candle_core::Device;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub(crate) struct AttentionTimer {
    host: Mutex<Duration>,
    #[cfg(feature = "cuda")]
    events: Mutex<Vec<(CudaEvent, CudaEvent)>>,
}

#[cfg(feature = "cuda")]
type CudaEvent = candle_core::cuda_backend::cudarc::driver::CudaEvent;

impl AttentionTimer {
    /// Runs `f`, adding its time to the total.
    pub fn time<R>(
        &self,
        device: &Device,
        f: impl FnOnce() -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        #[cfg(feature = "cuda")]
        if let Device::Cuda(dev) = device {
            use candle_core::cuda_backend::WrapErr;
            use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
            let stream = dev.cuda_stream();
            let start = stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .w()?;
            let out = f()?;
            let end = stream
                .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .w()?;
            self.events
                .lock()
                .expect("invariant: no panic while timing")
                .push((start, end));
            return Ok(out);
        }
        let _ = device;
        let start = Instant::now();
        let out = f()?;
        *self.host.lock().expect("invariant: no panic while timing") += start.elapsed();
        Ok(out)
    }

    /// The time so far. On CUDA this waits for the timed work to finish.
    pub fn total(&self) -> candle_core::Result<Duration> {
        #[allow(unused_mut)]
        let mut total = *self.host.lock().expect("invariant: no panic while timing");
        #[cfg(feature = "cuda")]
        {
            use candle_core::cuda_backend::WrapErr;
            for (start, end) in self
                .events
                .lock()
                .expect("invariant: no panic while timing")
                .iter()
            {
                let ms = start.elapsed_ms(end).w()?;
                total += Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
            }
        }
        Ok(total)
    }
}
