//! Fuzz the control socket's request parser (`parse_request`): never
//! panics; whatever it accepts is a request object whose command is the
//! verb it returns, and that verb's own request line parses back to it.
#![no_main]

use ignition_vmm::machine::control_socket::{parse_request, ErrorCode};
use base64::Engine;
use ignition_vmm::machine::ops::Op;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match parse_request(data) {
        Ok(op) => {
            let line = match &op {
                Op::Snapshot { name, .. } => {
                    serde_json::json!({"command": "snapshot", "name": name})
                }
                Op::Pause => serde_json::json!({"command": "pause"}),
                Op::Resume => serde_json::json!({"command": "resume"}),
                Op::Status => serde_json::json!({"command": "status"}),
                Op::Quit => serde_json::json!({"command": "quit"}),
                Op::Branch {
                    name,
                    count,
                    net,
                    start,
                } => {
                    let mut line =
                        serde_json::json!({"command": "branch", "name": name, "count": count});
                    if let Some(net) = net {
                        line["net"] = net.clone().into();
                    }
                    if let Some(start) = start {
                        line["start"] = serde_json::to_value(start).expect("a start serializes");
                    }
                    line
                }
                Op::Exec(e) => {
                    let mut line = serde_json::json!({
                        "command": "exec", "argv": e.argv, "timeout_ms": e.timeout_ms
                    });
                    if let Some(stdin) = &e.stdin {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(stdin);
                        line["stdin"] = b64.into();
                    }
                    line
                }
            };
            assert_eq!(parse_request(line.to_string().as_bytes()), Ok(op));
        }
        Err(e) => {
            assert!(matches!(
                e.code,
                ErrorCode::BadRequest | ErrorCode::UnknownCommand
            ));
            assert!(!e.message.is_empty());
        }
    }
});
