"""The sampler tests' small vocabulary: semantic ids from SEM_BEGIN, V of them, eos below, a RAS window of W."""

SEM_BEGIN, EOS, V, W = 300, 2, 256, 10
