// Package sample turns a vector of logits into the next token, and decides
// when generation stops.
//
// # Stage order
//
// Every stage is a plain function (the methods of Candidates, ApplyPenalties,
// Greedy); Sampler.Sample runs them in this fixed order, with fused fast
// paths that the tests check against the plain functions:
//
//	| # | stage        | what it does                                                       | disabled when          |
//	|---|--------------|--------------------------------------------------------------------|------------------------|
//	| 1 | penalties    | for each token seen c times in the last RepeatLastN accepted       | all three neutral      |
//	|   |              | tokens: logit>0 ? logit/repeat : logit*repeat, then                 |                        |
//	|   |              | logit -= presence + frequency*c                                     |                        |
//	| 2 | greedy       | Temperature == 0: argmax (ties to the lowest id); stop here        | Temperature > 0        |
//	| 3 | top-k        | keep the K best tokens (bounded heap, no full sort)                 | TopK == 0 or >= vocab  |
//	| 4 | temperature  | logit /= Temperature                                                | Temperature == 1       |
//	| 5 | softmax      | probabilities over the remaining set                                | never                  |
//	| 6 | top-p        | keep the smallest best-first set with mass >= TopP (at least one)  | TopP == 0 or 1         |
//	| 7 | min-p        | drop tokens with p < MinP * p_max                                   | MinP == 0              |
//	| 8 | renormalise  | scale the kept probabilities to sum to one                          | never                  |
//	| 9 | draw         | inverse CDF with one uniform from the seeded PCG                    | never                  |
//
// "Best first" means descending logit, ties broken by ascending token id, so
// every stage is deterministic. Log-probabilities reported in Result come
// from the raw logits (before stage 1), like OpenAI's logprobs and the
// default of llama.cpp's n_probs and vLLM.
//
// # Comparison with llama.cpp and Hugging Face transformers
//
// Penalties: the repetition penalty is the one of llama.cpp and HF
// (RepetitionPenaltyLogitsProcessor: divide positive logits, multiply
// non-positive ones); presence and frequency are OpenAI's formula, which is
// also what llama.cpp's penalties sampler applies. Like llama.cpp, all three
// look at one window of the last RepeatLastN accepted tokens (default 64);
// HF's repetition penalty looks at the whole sequence (RepeatLastN < 0 gives
// that). The caller decides which tokens enter the window via Accept
// (llama.cpp's server feeds it the prompt too).
//
// Truncation versus temperature: HF applies its warpers in the order
// temperature → top-k → top-p → min-p, and vLLM also applies temperature
// before top-k/top-p/min-p. Because top-k does not depend on temperature
// (dividing by a positive number keeps the order), our order top-k →
// temperature → top-p → min-p is exactly HF's. llama.cpp's default chain is
// penalties → DRY → top-n-σ → top-k → typical → top-p → min-p → XTC →
// temperature → dist: it applies temperature last, so its top-p and min-p
// see the untempered (T = 1) distribution. With T ≠ 1 the two choices keep
// different sets: at T < 1 llama.cpp keeps more tokens than we do, at T > 1
// fewer. We follow HF/vLLM because the sampling defaults that models ship in
// generation_config.json are read by those two, and because then
// "temperature, then truncate" means the same thing for every truncation. We omit DRY, typical-p, XTC, top-n-σ and mirostat.
//
// Greedy: llama.cpp treats temperature <= 0 as "keep only the best token";
// HF uses do_sample=False. Both match stage 2 (penalties still apply). We
// skip the draw entirely, so greedy calls consume no random numbers.
//
// # Non-finite logits
//
// NaN is an error (*NaNError) rather than a silently skipped token: it
// signals a numerical bug upstream. -Inf masks a token (it is never drawn).
// If some logits are +Inf, those tokens share all the probability equally.
// All -Inf gives ErrNoCandidates. Nothing panics.
//
// # Stopping
//
// StopChecker applies end-of-sequence token ids and OpenAI-style stop
// strings to streamed text: it holds back any tail that could still grow
// into a stop string (across token boundaries) and never emits the stop
// string itself.
package sample
