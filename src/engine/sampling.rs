//! Choosing the next token from raw logits, and the logprobs reported for it.
//!
//! Logprobs are always the log-softmax of the model's raw logits (what a trainer compares its
//! own forward pass with), whatever temperature or truncation shaped the choice. The choice
//! follows the usual order: top-k, then top-p, then min-p, then temperature, then a draw from a
//! seeded generator (same seed and same logits → same token).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How one sample chooses its tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingConfig {
    /// 0 picks the most likely token.
    pub temperature: f32,
    /// 0 (or below) keeps every token.
    pub top_k: usize,
    /// Nucleus sampling threshold (1 keeps every token).
    pub top_p: f32,
    /// Tokens below this fraction of the top probability are dropped (0 keeps all).
    pub min_p: f32,
    /// Seed of the request's generator (random when unset).
    pub seed: Option<u64>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
        }
    }
}

/// A token chosen from a distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub token: u32,
    /// Its log-softmax under the raw logits.
    pub logprob: f32,
    /// The `top` most likely tokens with their raw logprobs, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// The sampling state of one sequence.
#[derive(Debug)]
pub struct Sampler {
    config: SamplingConfig,
    rng: ChaCha8Rng,
    /// Reused per token: `exp(logit - max)` for every vocabulary entry.
    scaled: Vec<f64>,
    /// Reused per token: the tokens still in the running.
    candidates: Vec<u32>,
}

impl Sampler {
    /// A sampler with its own generator.
    pub fn new(config: SamplingConfig) -> Self {
        let rng = match config.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        };
        Self {
            config,
            rng,
            scaled: Vec::new(),
            candidates: Vec::new(),
        }
    }

    /// Picks the next token from `logits` (one per vocabulary entry); `top` alternatives are
    /// reported with it.
    pub fn choose(&mut self, logits: &[f32], top: usize) -> Choice {
        self.choose_within(logits, None, top)
    }

    /// [`Sampler::choose`] under a constraint: `allowed` is `logits` with every token the
    /// constraint forbids at minus infinity. The token is drawn from `allowed`; its logprob and
    /// the alternatives are still the raw logits' (what the model itself gave the token).
    pub fn choose_within(&mut self, logits: &[f32], allowed: Option<&[f32]>, top: usize) -> Choice {
        // A constraint that allows nothing is no constraint (it cannot be met anyway).
        let allowed = allowed.filter(|allowed| allowed.iter().any(|l| l.is_finite()));
        let drawn_from = allowed.unwrap_or(logits);
        let max = drawn_from.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.scaled.clear();
        self.scaled
            .extend(drawn_from.iter().map(|&l| f64::from(l - max).exp()));
        let log_z = match allowed {
            None => f64::from(max) + self.scaled.iter().sum::<f64>().ln(),
            Some(_) => log_sum_exp(logits),
        };
        let token = self.pick(drawn_from);
        let mut alternatives = Vec::new();
        if top > 0 {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            let top = top.min(order.len());
            order.select_nth_unstable_by(top - 1, |a, b| logits[*b].total_cmp(&logits[*a]));
            order.truncate(top);
            order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
            alternatives = order
                .into_iter()
                .map(|i| (i as u32, (f64::from(logits[i]) - log_z) as f32))
                .collect();
        }
        Choice {
            token: token as u32,
            logprob: (f64::from(logits[token]) - log_z) as f32,
            top: alternatives,
        }
    }

    /// Draws a token; `self.scaled` holds `exp(logit - max)`. Only top-p needs the candidates
    /// sorted; top-k selects, min-p filters against the most likely token's weight (1).
    fn pick(&mut self, logits: &[f32]) -> usize {
        let config = &self.config;
        if config.temperature <= 0.0 || config.top_k == 1 {
            return argmax(logits);
        }
        let candidates = &mut self.candidates;
        candidates.clear();
        candidates.extend(0..logits.len() as u32);
        let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
        if config.top_k > 0 && config.top_k < candidates.len() {
            candidates.select_nth_unstable_by(config.top_k - 1, by_logit);
            candidates.truncate(config.top_k);
        }
        if config.top_p < 1.0 {
            candidates.sort_by(by_logit);
            let total: f64 = candidates.iter().map(|&i| self.scaled[i as usize]).sum();
            let mut cumulative = 0.0;
            let keep = candidates
                .iter()
                .position(|&i| {
                    cumulative += self.scaled[i as usize] / total;
                    cumulative >= f64::from(config.top_p)
                })
                .map_or(candidates.len(), |at| at + 1);
            candidates.truncate(keep);
        }
        if config.min_p > 0.0 {
            let floor = f64::from(config.min_p);
            candidates.retain(|&i| self.scaled[i as usize] >= floor);
        }
        let inverse_temperature = 1.0 / f64::from(config.temperature);
        if inverse_temperature != 1.0 {
            // `scaled` is not read again for this token: temper the candidates' weights in place.
            for &i in candidates.iter() {
                let weight = &mut self.scaled[i as usize];
                *weight = weight.powf(inverse_temperature);
            }
        }
        let total: f64 = candidates.iter().map(|&i| self.scaled[i as usize]).sum();
        let mut draw = self.rng.random::<f64>() * total;
        for &i in candidates.iter() {
            draw -= self.scaled[i as usize];
            if draw <= 0.0 {
                return i as usize;
            }
        }
        candidates
            .last()
            .map_or_else(|| argmax(logits), |&i| i as usize)
    }
}

/// The log of the sum of `exp(logit)`: the raw distribution's normaliser.
fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    f64::from(max) + sum.ln()
}

fn argmax(logits: &[f32]) -> usize {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOGITS: [f32; 5] = [1.0, 3.0, 2.0, -1.0, 3.0];

    #[test]
    fn a_constraint_limits_the_draw_but_not_the_logprobs() {
        let allowed = [
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            2.0,
            -1.0,
            f32::NEG_INFINITY,
        ];
        let z: f64 = LOGITS.iter().map(|&l| f64::from(l).exp()).sum();
        for temperature in [0.0, 1.0] {
            let mut sampler = Sampler::new(SamplingConfig {
                temperature,
                seed: Some(3),
                ..SamplingConfig::default()
            });
            for _ in 0..20 {
                let choice = sampler.choose_within(&LOGITS, Some(&allowed), 1);
                assert!(choice.token == 2 || choice.token == 3);
                let raw = f64::from(LOGITS[choice.token as usize]) - z.ln();
                assert!((f64::from(choice.logprob) - raw).abs() < 1e-6);
                assert_eq!(choice.top[0].0, 1, "alternatives are the model's own");
            }
        }
        let nothing = [f32::NEG_INFINITY; 5];
        let mut greedy = Sampler::new(SamplingConfig {
            temperature: 0.0,
            ..SamplingConfig::default()
        });
        assert_eq!(greedy.choose_within(&LOGITS, Some(&nothing), 0).token, 1);
    }

    #[test]
    fn logprobs_are_the_raw_log_softmax_and_greedy_takes_the_first_best() {
        let mut greedy = Sampler::new(SamplingConfig {
            temperature: 0.0,
            ..SamplingConfig::default()
        });
        let choice = greedy.choose(&LOGITS, 2);
        assert_eq!(choice.token, 1);
        let z: f64 = LOGITS.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(choice.logprob) - (3.0 - z.ln())).abs() < 1e-6);
        assert_eq!(choice.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4]);
        let total: f64 = (0..5)
            .map(|_| {
                f64::from(
                    greedy
                        .choose(&LOGITS, 5)
                        .top
                        .iter()
                        .map(|t| t.1.exp())
                        .sum::<f32>(),
                )
            })
            .sum();
        assert!((total / 5.0 - 1.0).abs() < 1e-5);
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let config = SamplingConfig {
            seed: Some(7),
            ..SamplingConfig::default()
        };
        let draw = |config: &SamplingConfig| -> Vec<u32> {
            let mut sampler = Sampler::new(config.clone());
            (0..50).map(|_| sampler.choose(&LOGITS, 0).token).collect()
        };
        assert_eq!(draw(&config), draw(&config));
        let other = SamplingConfig {
            seed: Some(8),
            ..config.clone()
        };
        assert_ne!(draw(&config), draw(&other));
        assert!(
            draw(&config).contains(&0),
            "plain sampling reaches unlikely tokens"
        );
    }

    #[test]
    fn truncation_limits_the_candidates() {
        let only = |config: SamplingConfig| -> std::collections::BTreeSet<u32> {
            let mut sampler = Sampler::new(SamplingConfig {
                seed: Some(1),
                ..config
            });
            (0..200).map(|_| sampler.choose(&LOGITS, 0).token).collect()
        };
        let top_k = only(SamplingConfig {
            top_k: 2,
            ..SamplingConfig::default()
        });
        assert_eq!(top_k, [1, 4].into());
        let top_p = only(SamplingConfig {
            top_p: 0.5,
            ..SamplingConfig::default()
        });
        assert_eq!(top_p, [1, 4].into());
        let min_p = only(SamplingConfig {
            min_p: 0.3,
            ..SamplingConfig::default()
        });
        assert_eq!(min_p, [1, 2, 4].into());
    }
}
