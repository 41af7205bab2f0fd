// Each test uses its part of the fake.
#[allow(dead_code)]
pub mod fake_apiserver;
