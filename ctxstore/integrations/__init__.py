"""Adapters that plug ctxstore sessions into agent frameworks.

Each module needs its framework, installed with the matching extra, and is
imported by its own name: ``import ctxstore`` never loads a framework.

- :mod:`ctxstore.integrations.openai_agents`: the OpenAI Agents SDK
  (extra ``openai-agents``);
- :mod:`ctxstore.integrations.langchain`: LangChain (extra ``langchain``);
- :mod:`ctxstore.integrations.amplifier`: Amplifier's context manager, the
  ``context-ctxstore`` module (extra ``amplifier``; the adapter itself
  imports nothing of it).
"""
