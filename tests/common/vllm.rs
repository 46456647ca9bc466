//! A real vLLM (the CPU wheel, installed by `scripts/install-vllm.sh` into a cache outside the
//! clone) serving a tiny random-weight Qwen3 with the pinned Qwen3 tokenizer, on 127.0.0.1.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The name the server is started with (`--served-model-name`).
pub const SERVED_NAME: &str = "tiny";

/// The python of vLLM's venv and the tiny model's folder.
pub fn installed() -> (PathBuf, PathBuf) {
    let paths = super::installed("install-vllm.sh", &["VLLM_PYTHON", "VLLM_MODEL"]);
    (paths[0].clone(), paths[1].clone())
}

/// The folder of the tiny vision-language models (`qwen2-vl`, `qwen2.5-vl`, `qwen3-vl`).
pub fn vision_models() -> PathBuf {
    let names = ["VLLM_PYTHON", "VLLM_MODEL", "VLLM_VL_MODELS"];
    super::installed("install-vllm.sh", &names)[2].clone()
}

/// A running vLLM server, stopped (with its engine process) when dropped.
pub struct VllmServer {
    pub port: u16,
    pub model: PathBuf,
    child: Child,
    log: PathBuf,
}

impl VllmServer {
    /// Starts `python -m vllm.entrypoints.openai.api_server` with `args` added, the dev-mode
    /// routes (`/pause`, `/weight_info`, ...) on, and waits until it serves (a cold start
    /// compiles the model: about a minute on 2 cores).
    pub fn start(args: &[&str]) -> Self {
        Self::start_model(installed().1, args)
    }

    /// [`VllmServer::start`] serving the model in folder `model`.
    pub fn start_model(model: PathBuf, args: &[&str]) -> Self {
        let (python, _) = installed();
        let port = super::free_port();
        // One folder per server: the tests of a file start theirs at once, and a scratch
        // folder is emptied when made.
        let log = super::scratch_dir(&format!("vllm-log-{port}")).join("server.log");
        let child = Command::new(&python)
            .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
            .arg(&model)
            .args(["--served-model-name", SERVED_NAME, "--host", "127.0.0.1"])
            .args(["--port", &port.to_string(), "--max-model-len", "4096"])
            // On CPU this is the share of the machine's memory vLLM takes; the KV cache is
            // sized apart below.
            .args(["--gpu-memory-utilization", "0.1", "--dtype", "bfloat16"])
            .args(args)
            .args(lora(args, &model))
            .env("VLLM_SERVER_DEV_MODE", "1")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1")
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut server = Self {
            port,
            model,
            child,
            log,
        };
        server.wait_ready();
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(600);
        while Instant::now() < deadline && self.child.try_wait().unwrap().is_none() {
            if super::answers_ok(self.port, "/health") {
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "vLLM on port {} did not start ({:?}); its log ends:\n{}",
            self.port,
            self.child.try_wait(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
}

/// With `--enable-lora`, the tiny model's random adapter served as `tiny-lora`.
fn lora(args: &[&str], model: &std::path::Path) -> Vec<String> {
    match args.contains(&"--enable-lora") {
        true => vec![
            "--lora-modules".into(),
            format!("tiny-lora={}", model.join("lora").display()),
        ],
        false => Vec::new(),
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        // The whole group: the API server and its engine-core process.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// A proxy told only `server`'s URL and the model's folder: the model name and context come
/// from the server.
pub fn proxy_for(server: &VllmServer) -> super::Proxy {
    let url = server.url();
    super::Proxy::start_with(
        server.model.clone(),
        None,
        super::mock_worker::MockWorker::start(super::mock_worker::Wire::Sglang),
        move |settings| {
            settings.backends = vec![url];
            settings.backend_kind = Some(rollout_proxy::backend::BackendKind::Vllm);
            settings.model_name = None;
        },
    )
}
