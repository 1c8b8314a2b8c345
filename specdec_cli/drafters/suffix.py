"""Suffix-automaton drafter: longest-match proposals over the request (and a global pool).

Each request keeps an online suffix automaton over its prompt + output. The longest
suffix of the sequence that also occurs earlier is the suffix link of the automaton's
last state; the proposal is what followed that suffix's first occurrence. With
``use_global_pool`` the tokens of finished requests form a second automaton that is
searched too, and the longer match wins. q is one-hot (retrieval drafter).
"""
from __future__ import annotations


from specdec_cli.config.schema import SuffixMethodConfig
from specdec_cli.drafters.base import DRAFTERS, Drafter, DrafterDeps, DraftRequest, Proposal
from specdec_cli.sampling.params import BatchParams


class SuffixAutomaton:
    """Online suffix automaton over a token sequence (O(1) amortised per appended token)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.first_end: list[int] = [-1]  # end index of the first occurrence of the state's strings
        self.last = 0

    def extend(self, token: int) -> None:
        pos = len(self.tokens)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, pos)
        state = self.last
        while state != -1 and token not in self.next[state]:
            self.next[state][token] = cur
            state = self.link[state]
        if state == -1:
            self.link[cur] = 0
        else:
            nxt = self.next[state][token]
            if self.length[state] + 1 == self.length[nxt]:
                self.link[cur] = nxt
            else:
                clone = self._new_state(self.length[state] + 1, self.first_end[nxt])
                self.next[clone] = dict(self.next[nxt])
                self.link[clone] = self.link[nxt]
                while state != -1 and self.next[state].get(token) == nxt:
                    self.next[state][token] = clone
                    state = self.link[state]
                self.link[nxt] = self.link[cur] = clone
        self.last = cur

    def _new_state(self, length: int, first_end: int) -> int:
        self.next.append({})
        self.link.append(-1)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.length) - 1

    def self_match(self) -> tuple[int, int]:
        """(match length, end index of its first occurrence) of the longest earlier-occurring suffix."""
        state = self.link[self.last]
        if state <= 0:
            return 0, -1
        return self.length[state], self.first_end[state]

    def match(self, query: list[int]) -> tuple[int, int]:
        """Longest suffix of ``query`` that occurs in this automaton: (length, first end index)."""
        state, matched = 0, 0
        for token in query:
            while state and token not in self.next[state]:
                state = self.link[state]
                matched = self.length[state]
            if token in self.next[state]:
                state, matched = self.next[state][token], matched + 1
        if matched == 0:
            return 0, -1
        return matched, self.first_end[state]


class SuffixDrafter(Drafter):

    def __init__(self, cfg: SuffixMethodConfig, vocab_size: int) -> None:
        self.cfg = cfg
        self.draft_vocab_size = vocab_size
        self.automata: dict[int, SuffixAutomaton] = {}
        self.pool = SuffixAutomaton() if cfg.use_global_pool else None
        self._pool_separator = -1

    def add_request(self, slot: int, prompt_ids: list[int]) -> None:
        self.automata[slot] = SuffixAutomaton()

    def remove_request(self, slot: int, token_ids: list[int]) -> None:
        self.automata.pop(slot, None)
        if self.pool is not None and len(self.pool.tokens) < self.cfg.max_pool_tokens:
            for token in token_ids:
                self.pool.extend(token)
            self.pool.extend(self._pool_separator)  # unique separators: no match spans requests
            self._pool_separator -= 1

    def forget_finished(self) -> None:
        if self.pool is not None:
            self.pool = SuffixAutomaton()
            self._pool_separator = -1

    def _draft_one(self, request: DraftRequest, k: int) -> list[int]:
        automaton = self.automata.setdefault(request.slot, SuffixAutomaton())
        for token in request.token_ids[len(automaton.tokens) :]:
            automaton.extend(token)
        length, end = automaton.self_match()
        source = automaton.tokens
        if self.pool is not None:
            pool_len, pool_end = self.pool.match(request.token_ids[-64:])
            if pool_len > length:
                length, end, source = pool_len, pool_end, self.pool.tokens
        if length < self.cfg.min_match_len:
            return []
        draft: list[int] = []
        for token in source[end + 1 : end + 1 + k]:
            if token < 0:  # a pool separator: the matched request ended here
                break
            draft.append(token)
        return draft

    def propose(self, requests: list[DraftRequest], k: int, params: BatchParams) -> Proposal:
        drafts = [self._draft_one(r, k) for r in requests]
        return Proposal.from_token_lists(drafts, k)


@DRAFTERS.register("suffix")
def build_suffix(cfg: SuffixMethodConfig, deps: DrafterDeps) -> Drafter:
    return SuffixDrafter(cfg, deps.vocab_size)
