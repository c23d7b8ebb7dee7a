"""Language models of one loaded model on many prompts: the prompt ids are data, so prompts of one
token length share the compiled sampling and scoring programs (tvjax.models.prompt_processes)."""

import jax
import numpy as np
import pytest

from tvjax.models import language_model, prompt_processes
from tvjax.models import process as lm_process
from tvjax.models.pairs import load_model

N = 3
FIRST, SECOND, LONGER = [1, 2, 3, 4], [5, 6, 7, 0], [2, 2, 5, 1, 7]
TOKENS = np.array([[1, 2, 3], [4, 5, 6], [7, 0, 1]], np.int32)


@pytest.fixture(scope="module")
def loaded():
    return load_model("random:llama")


def _programs():
    return lm_process._sample._cache_size(), lm_process._path_logprobs._cache_size()


def _outputs(lm):
    return np.asarray(lm.sample(jax.random.key(0), 64)), np.asarray(lm.path_logprobs(TOKENS))


def test_equal_length_prompts_share_programs(loaded):
    first, second, longer = prompt_processes(loaded, [FIRST, SECOND, LONGER], N)
    assert (first.prompt, second.prompt, longer.prompt) == (tuple(FIRST), tuple(SECOND), tuple(LONGER))
    assert all(isinstance(t, int) for t in second.prompt) and len(second.prompt) == second.prompt_length == 4
    assert second.state is first.state  # one copy of the served weights
    samples_first, logprobs_first = _outputs(first)
    compiled = _programs()
    samples_second, logprobs_second = _outputs(second)
    assert _programs() == compiled  # no new compile for a prompt of the same length
    # a different prompt: different log-probabilities (and, here, different draws from the same key)
    assert not np.allclose(logprobs_first, logprobs_second)
    assert not np.array_equal(samples_first, samples_second)
    # the same as a LanguageModel built on its own for that prompt
    fresh_samples, fresh_logprobs = _outputs(language_model(loaded, SECOND, N))
    np.testing.assert_array_equal(samples_second, fresh_samples)
    np.testing.assert_allclose(logprobs_second, fresh_logprobs, rtol=1e-6, atol=1e-6)
    _outputs(longer)  # another length: its own programs
    assert _programs() == (compiled[0] + 1, compiled[1] + 1)


def test_variant_and_with_prompt_keep_the_prompt(loaded):
    base = language_model(loaded, FIRST, N)
    cooler = base.with_prompt(SECOND).variant(temperature=0.5)
    assert cooler.prompt == tuple(SECOND)
    np.testing.assert_allclose(np.asarray(cooler.path_logprobs(TOKENS)),
                               np.asarray(language_model(loaded, SECOND, N, temperature=0.5).path_logprobs(TOKENS)),
                               rtol=1e-6, atol=1e-6)
    # a serving change recomputes the prompt cache from the ids (data now)
    half = base.with_prompt(SECOND).variant(dtype="bfloat16")
    assert half.prompt == tuple(SECOND)
    np.testing.assert_array_equal(np.asarray(half.first_logits),
                                  np.asarray(language_model(loaded, SECOND, N, dtype="bfloat16").first_logits))
    with pytest.raises(ValueError, match="must lie in"):
        base.with_prompt([99])


def test_prompt_processes_settings_and_bad_input(loaded):
    sides = prompt_processes(loaded, [FIRST, SECOND], N, temperature=0.7, weights="int8")
    assert all(lm.sampling.temperature == 0.7 and lm.serving.weights == "int8" for lm in sides)
    assert sides[1].state is sides[0].state  # the int8 weights computed once
    np.testing.assert_allclose(np.asarray(sides[1].path_logprobs(TOKENS)),
                               np.asarray(language_model(loaded, SECOND, N, temperature=0.7, weights="int8")
                                          .path_logprobs(TOKENS)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="empty"):
        prompt_processes(loaded, [], N)
    with pytest.raises(TypeError, match="sequence of prompts"):
        prompt_processes(loaded, "a text", N)
    with pytest.raises(TypeError, match="a prompt is"):
        prompt_processes(loaded, FIRST, N)  # token ids of one prompt, not a list of prompts
    with pytest.raises(ValueError, match="tokenizer"):
        prompt_processes(loaded, [FIRST, "a text"], N)
