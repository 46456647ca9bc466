//! Every API's request reader on arbitrary bytes: each answers with a request or an error,
//! never a panic (the HTTP tests check the errors' shapes; this checks nothing else breaks).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rollout_proxy::http::read_turn;
use rollout_proxy::session::Api;

fuzz_target!(|data: &[u8]| {
    for api in Api::ALL {
        let _ = read_turn(api, data);
    }
});
