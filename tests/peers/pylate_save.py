"""Write a ColBERT checkpoint as a PyLate user saves one: ``models.ColBERT(base).save(out)``.

    python pylate_save.py BASE_DIR OUT_DIR

tests/data/pylate-1.2.0-colbert was written by this script in a venv with pylate 1.2.0, sentence-transformers 4.0.2,
transformers 4.48.2 and torch 2.13.0 (pip install torch==2.13.0 'transformers==4.48.2' 'sentence-transformers==4.0.2'
ujson datasets scipy && pip install --no-deps 'pylate==1.2.0'), from kiln's tiny BERT
(kiln.testing.factory.build_tiny_model("bert", TaskName.FEATURE_EXTRACTION, BASE_DIR, shape={"max_position_embeddings":
512, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}): BERT's 512
positions, so PyLate's default document length of 180 fits; its tokenizer_config's tokenizer_class set to
BertTokenizerFast, which transformers 4 reads), and its README.md (the model card) removed.
What that version writes and later ones read differently: the [Q]/[D] markers as added tokens, PyLate's Dense in
1_Dense, and the tokenizer saved with [MASK] as its padding token (PyLate expands queries by padding them).
"""

from __future__ import annotations

import sys

from pylate import models


def main() -> None:
    base, out = sys.argv[1:3]
    models.ColBERT(model_name_or_path=base, device="cpu").save(out)


if __name__ == "__main__":
    main()
