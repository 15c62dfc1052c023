//! Squash: a chain materialised into one new full layer.

use std::sync::Arc;

use crate::chain_disk::ChainDisk;
use crate::error::{Error, Result};
use crate::layer::Layer;
use crate::name::validate_name;
use crate::progress::{Progress, ProgressFn};
use crate::restore::map_chain_memory;
use crate::store::Store;
use crate::verify::verify_chain_with_progress;

impl Store {
    /// Materialise the chain `spec` into a new full layer `new_name`:
    /// memory is the chain's overlay result, the disk the chain's (the top
    /// layer's, its diffs applied: one `disk.img`), the state the top
    /// layer's, no parent. The chain is verified first; the write is
    /// atomic like any snapshot. `progress` receives stage and hashing
    /// events.
    pub fn squash(
        &self,
        spec: &str,
        new_name: &str,
        progress: Option<ProgressFn<'_>>,
    ) -> Result<Layer> {
        validate_name(new_name)?;
        if self.root().join(new_name).symlink_metadata().is_ok() {
            return Err(Error::Exists {
                name: new_name.to_string(),
                store: self.root().to_path_buf(),
            });
        }
        let stage = |s: &str| {
            if let Some(p) = progress {
                p(Progress::Stage(s));
            }
        };
        stage(&format!("resolving and verifying '{spec}'"));
        let chain = self.resolve(spec)?;
        verify_chain_with_progress(&chain, progress)?;
        stage(&format!(
            "overlaying {} layer(s): {}",
            chain.len(),
            chain.describe()
        ));
        let memory = map_chain_memory(&chain)?;
        let top = chain.top();
        let mut meta = top.child_meta(&top.manifest.creator);
        meta.parent = None;
        let state = top.read_state()?;
        let mut w = self.begin(new_name, meta)?;
        stage(&format!(
            "writing '{new_name}' ({} MiB of memory)",
            top.manifest.ram_size >> 20
        ));
        w.write_full_memory(&memory)?;
        w.write_state(&state)?;
        if let Some(disk) = ChainDisk::open(&chain)? {
            // One whole image: the chain's disk, diffs applied.
            if let Some(copy) = w.begin_disk_from(Arc::new(disk), None)? {
                copy.run()?;
            }
            let clone = w.complete_disk()?;
            stage(&format!("disk cloned by {clone}"));
        }
        stage("committing");
        w.commit()
    }
}
