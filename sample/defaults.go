package sample

// Defaults returns the sampling parameters every cortiq front end starts
// from (cortiq run, cortiq chat, and the server to come), llama.cpp's
// defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05, no
// repetition penalties over a window of 64 tokens. The seed is left 0:
// front ends draw a random one unless the user gives one (RandomSeed).
func Defaults() Params {
	return Params{
		Temperature:   0.8,
		TopK:          40,
		TopP:          0.95,
		MinP:          0.05,
		RepeatPenalty: 1,
		RepeatLastN:   DefaultRepeatLastN,
	}
}

// RandomSeed is the seed value (llama.cpp's -1) that asks for a fresh
// random seed per run.
const RandomSeed = -1
