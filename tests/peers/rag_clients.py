"""Run in the RAG frameworks' venv (.venv-clients): LlamaIndex's TEI embedder and LangChain's OpenAIEmbeddings, as
they ship, against an embedding server.

Usage: python rag_clients.py BASE_URL MODEL TEXT [TEXT ...]
Prints one JSON object: {"llama_index": [[...], ...], "llama_index_query": [...], "langchain": [[...], ...],
"langchain_query": [...]}: each framework's document embeddings of the texts and its query embedding of the first.

LangChain's OpenAIEmbeddings counts tokens with tiktoken by default, which downloads its encoding on first use; with
``check_embedding_ctx_length=False`` (LangChain's switch for servers other than OpenAI's) it sends the texts as they
are, offline.
"""

from __future__ import annotations

import json
import sys


def main(base: str, model: str, texts: list[str]) -> dict:
    from langchain_openai import OpenAIEmbeddings
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    llama = TextEmbeddingsInference(model_name=model, base_url=base, embed_batch_size=4)
    chain = OpenAIEmbeddings(model=model, base_url=f"{base}/v1", api_key="unused", check_embedding_ctx_length=False,
                             chunk_size=4)
    return {"llama_index": llama.get_text_embedding_batch(texts), "llama_index_query": llama.get_query_embedding(
        texts[0]), "langchain": chain.embed_documents(texts), "langchain_query": chain.embed_query(texts[0])}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3:])))
