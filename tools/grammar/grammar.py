"""Seeded generator of English sentences with Universal Dependencies (UD v2) trees.

Not part of the default treebank since headscope 0.2: grammar sentences made heads look more
syntactic than they are on natural text (docs/syntax.md). ``generated.conllu`` beside this file
is its output, for users who want it: ``headscope analyze --treebank tools/grammar/generated.conllu``.

Every phrase is built together with its arcs, so the trees are right by construction. The
conventions are those of UD English EWT: determiner, adjective, number, compound and possessor
hang from the noun (possessive ``'s`` is ``case`` on the possessor, ``her`` in "her dog" is
``nmod:poss``); copular ``be`` is ``cop`` under its predicate; infinitival ``to`` and
complementiser ``that`` are ``mark``; ``cc`` and a separating comma hang from the following
conjunct; a comma after fronted material and the final punctuation hang from the root.

Offers:
    Word       -- one syntactic word under construction (form, UPOS, head, relation).
    generate   -- ``count`` sentences from a seed, each a list of ``Word`` in surface order.
    to_conllu  -- CoNLL-U text for generated sentences (``# sent_id = gen-N`` and ``# text``).
    main       -- write ``generated.conllu`` next to this file; the same bytes on every run.

The words come from ``lexicon.json`` beside this file; the grammar (its rules and the weights
of each choice) is the code below. Run ``python tools/grammar/grammar.py`` to rewrite
``tools/grammar/generated.conllu`` (or give another path as the one argument).
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Word", "generate", "to_conllu", "main", "SEED", "SENTENCE_COUNT"]

SEED = 2019
SENTENCE_COUNT = 700
MIN_WORDS, MAX_WORDS = 6, 25  # punctuation included
OUTPUT_PATH = Path(__file__).with_name("generated.conllu")


# ----------------------------------------------------------------------------- words and arcs
@dataclass(eq=False)  # identity, not equality: two "the" are different words
class Word:
    """One syntactic word; ``head`` is the governing Word, None while it heads its phrase."""

    form: str
    upos: str
    lemma: str = ""
    head: Word | None = None
    deprel: str = ""
    space_after: bool = True

    def __post_init__(self):
        if not self.lemma:
            keep_case = self.upos == "PROPN" or self.form == "I"
            self.lemma = self.form if keep_case else self.form.lower()


def _head(words: list[Word]) -> Word:
    """The one word of a phrase that has no head yet."""
    free = [word for word in words if word.head is None]
    if len(free) != 1:
        raise AssertionError(f"phrase {[w.form for w in words]} has {len(free)} heads")
    return free[0]


def _attach(words: list[Word], governor: Word, relation: str) -> list[Word]:
    """Hang a phrase's head from ``governor``; returns the phrase."""
    head = _head(words)
    head.head, head.deprel = governor, relation
    return words


def _attach_modifier(words: list[Word], governor: Word) -> list[Word]:
    """An adverb is ``advmod``; a (prepositional) noun phrase modifying a predicate is ``obl``."""
    return _attach(words, governor, "advmod" if _head(words).upos == "ADV" else "obl")


def _dep(word: Word, governor: Word, relation: str) -> Word:
    word.head, word.deprel = governor, relation
    return word


# ----------------------------------------------------------------------------- lexicon
@dataclass(frozen=True)
class Noun:
    singular: str
    plural: str
    modifier: str = ""  # "coffee" in the compound "coffee shop"


@dataclass(frozen=True)
class Verb:
    base: str
    third: str
    past: str
    participle: str
    ing: str
    frame: str  # transitive, intransitive, ditransitive, saying, control, object_control, linking
    objects: tuple[str, ...] = ()  # noun categories it takes as object

    def form(self, key: str) -> str:
        return getattr(self, key)


def _plural(noun: str) -> str:
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _nouns(entries: list[str]) -> tuple[Noun, ...]:
    """Parse ``["girl", "child:children", "coffee_shop"]``: irregular plural after ':', compound '_'."""
    nouns = []
    for entry in entries:
        modifier, _, word = entry.rpartition("_")
        singular, _, plural = word.partition(":")
        nouns.append(Noun(singular, plural or _plural(singular), modifier))
    return tuple(nouns)


def _third(base: str) -> str:
    if base == "have":
        return "has"
    if base.endswith(("s", "x", "z", "o", "ch", "sh")):
        return base + "es"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ies"
    return base + "s"


def _past(base: str, double: bool) -> str:
    if double:
        return base + base[-1] + "ed"
    if base.endswith("e"):
        return base + "d"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ied"
    return base + "ed"


def _ing(base: str, double: bool) -> str:
    if double:
        return base + base[-1] + "ing"
    if base.endswith("ie"):
        return base[:-2] + "ying"
    if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
        return base[:-1] + "ing"
    return base + "ing"


def _verbs(frame: str, entries: list[str]) -> tuple[Verb, ...]:
    """Parse ``["eat/ate/eaten=food", "drop+=thing"]``: '+' doubles the last consonant, '=' objects."""
    verbs = []
    for entry in entries:
        spelling, _, objects = entry.partition("=")
        base, *irregular = spelling.split("/")
        double = base.endswith("+")
        base = base.rstrip("+")
        past = irregular[0] if irregular else _past(base, double)
        participle = irregular[1] if len(irregular) > 1 else past
        verbs.append(Verb(base, _third(base), past, participle, _ing(base, double), frame,
                          tuple(objects.split(",")) if objects else ()))
    return tuple(verbs)


# The words live in lexicon.json beside this file, one list per table, in the order the seeded
# choices draw them (reordering a list changes the output). Nouns are spelt "girl",
# "child:children" (irregular plural), "coffee_shop" (compound modifier before "_"); verbs
# "eat/ate/eaten=food" (irregular past and participle, object categories after "="), "drop+"
# (doubles its last consonant).
LEXICON_PATH = Path(__file__).with_name("lexicon.json")
_LEXICON = json.loads(LEXICON_PATH.read_text(encoding="utf-8"))

NOUNS = {category: _nouns(entries) for category, entries in _LEXICON["nouns"].items()}
COMPOUNDS = {category: _nouns(entries) for category, entries in _LEXICON["compounds"].items()}
PLACE_PARTS = _LEXICON["place_parts"]  # "the edge of the forest"
NAMES = _LEXICON["names"]
DAYS = _LEXICON["days"]
DAY_PARTS = _LEXICON["day_parts"]
MEALS = _LEXICON["meals"]  # "after lunch": no determiner
ADJECTIVES = _LEXICON["adjectives"]  # by the category of noun they describe
# Adjectives that come late in a stack ("a clever young teacher", "the shiny red ball").
LATE_ADJECTIVES = set(_LEXICON["late_adjectives"])
UNGRADABLE = set(_LEXICON["ungradable"])  # no "very" before them
DEGREE_ADVERBS = _LEXICON["degree_adverbs"]
MANNER_ADVERBS = _LEXICON["manner_adverbs"]
FREQUENCY_ADVERBS = _LEXICON["frequency_adverbs"]
PLACE_ADVERBS = _LEXICON["place_adverbs"]
TIME_ADVERBS = {tense: tuple(words) for tense, words in _LEXICON["time_adverbs"].items()}  # by tense
LOCATIVE_PREPOSITIONS = _LEXICON["locative_prepositions"]
NOUN_MODIFIERS = {category: tuple(options) for category, options in _LEXICON["noun_modifiers"].items()}
# (preposition and the category of its object, for "the book on the table")
SUBORDINATORS = _LEXICON["subordinators"]
PERSON_PRONOUNS = tuple(tuple(forms) for forms in _LEXICON["person_pronouns"])  # (subject, object, agreement)
ANIMAL_PRONOUNS = tuple(tuple(forms) for forms in _LEXICON["animal_pronouns"])
POSSESSIVE_PRONOUNS = _LEXICON["possessive_pronouns"]
NUMBERS = _LEXICON["numbers"]
MODALS = _LEXICON["modals"]
BE = {(tense, agreement): form for tense, agreement, form in _LEXICON["be"]}
VERBS = {frame: _verbs(frame, entries) for frame, entries in _LEXICON["verbs"].items()}
ANIMAL_VERBS = set(_LEXICON["animal_verbs"])  # what an animal subject may do
STATIVE = set(_LEXICON["stative"])  # no progressive tenses

TENSES = {"present": 25, "past": 30, "will": 10, "modal": 10, "present progressive": 7,
          "past progressive": 5, "present perfect": 8, "past perfect": 5}
PAST_TENSES = ("past", "past progressive", "past perfect")
MAIN_KINDS = {"transitive": 28, "intransitive": 12, "ditransitive": 5, "copular": 16, "link": 6,
              "xcomp": 16, "ccomp": 20}
EMBEDDED_KINDS = {"transitive": 35, "intransitive": 20, "copular": 25, "link": 8, "xcomp": 12}
SIMPLE_KINDS = {"transitive": 35, "intransitive": 20, "copular": 25, "link": 8, "xcomp": 12}
SHAPES = {"plain": 40, "fronted": 15, "coordinated": 15, "adverbial": 20, "question": 10}


@dataclass
class _Nominal:
    words: list[Word]
    agreement: str  # what a finite verb agrees with: "1sg", "3sg" or "pl"
    modified: bool = False  # ends in a PP, relative clause or conjunct: a PP after it is ambiguous


# ----------------------------------------------------------------------------- the grammar
class _Grammar:
    """Builds one sentence at a time, drawing every choice from one seeded generator."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def chance(self, probability: float) -> bool:
        return self.rng.random() < probability

    def pick(self, options):
        return self.rng.choice(options)

    def weighted(self, weights: dict[str, float]) -> str:
        keys = list(weights)
        return self.rng.choices(keys, weights=[weights[key] for key in keys])[0]

    # -- noun phrases
    def nominal(self, category: str, *, case: str = "subj", depth: int = 0,
                pronoun: float = 0.15) -> _Nominal:
        if category in ("person", "animal") and self.chance(pronoun):
            table = PERSON_PRONOUNS if category == "person" else ANIMAL_PRONOUNS
            subject_form, object_form, agreement = self.pick(table)
            lemma = subject_form if subject_form == "I" else subject_form.lower()
            form = subject_form if case == "subj" else object_form
            return _Nominal([Word(form, "PRON", lemma)], agreement)
        if category == "person" and self.chance(0.12):
            return _Nominal([Word(self.pick(NAMES), "PROPN")], "3sg")
        return self.common_nominal(category, depth)

    def common_nominal(self, category: str, depth: int) -> _Nominal:
        if category == "place" and depth == 0 and self.chance(0.08):
            part = Word(self.pick(PLACE_PARTS), "NOUN")  # "the edge of the forest"
            of = Word("of", "ADP")
            place = self.common_nominal("place", depth + 1).words
            _dep(of, _head(place), "case")
            return _Nominal([_dep(Word("the", "DET"), part, "det"), part, of]
                            + _attach(place, part, "nmod"), "3sg", modified=True)
        noun = self.pick(COMPOUNDS[category] if self.chance(0.16) else NOUNS[category])
        plural = self.chance(0.3)
        head = Word(noun.plural if plural else noun.singular, "NOUN", noun.singular)
        words = [head]
        if noun.modifier:
            words.insert(0, _dep(Word(noun.modifier, "NOUN"), head, "compound"))
        words[:0] = self.determiner(head, plural, depth) + self.adjectives(category, head)
        nominal = _Nominal(words, "pl" if plural else "3sg")
        if depth == 0 and self.chance(0.12):
            preposition, target = self.pick(NOUN_MODIFIERS[category]).split()
            words += _attach(self.prepositional(preposition, target, depth + 1), head, "nmod")
            nominal.modified = True
        elif depth == 0 and self.chance(0.05):
            words += self.relative_clause(category, head, plural)
            nominal.modified = True
        return nominal

    def determiner(self, noun: Word, plural: bool, depth: int) -> list[Word]:
        choice = self.weighted({"article": 6, "demonstrative": 1, "pronoun": 1.4,
                                "possessor": 1.4 if depth == 0 else 0,
                                "number": 1.2 if plural else 0, "bare": 1 if plural else 0})
        if choice == "article":
            article = "the" if plural or self.chance(0.55) else "a"
            return [_dep(Word(article, "DET"), noun, "det")]
        if choice == "demonstrative":
            options = ("these", "those", "some") if plural else ("this", "that", "every")
            return [_dep(Word(self.pick(options), "DET"), noun, "det")]
        if choice == "pronoun":
            return [_dep(Word(self.pick(POSSESSIVE_PRONOUNS), "PRON"), noun, "nmod:poss")]
        if choice == "possessor":
            return self.possessor(noun)
        if choice == "number":
            article = [_dep(Word("the", "DET"), noun, "det")] if self.chance(0.3) else []
            return article + [_dep(Word(self.pick(NUMBERS), "NUM"), noun, "nummod")]
        return []

    def possessor(self, possessed: Word) -> list[Word]:
        """"Maria's", "the old farmer's", "my sister's": the owner is nmod:poss, 's its case."""
        if self.chance(0.35):
            owner = [Word(self.pick(NAMES), "PROPN")]
        else:
            category = self.pick(("person", "person", "animal"))
            noun = self.pick(NOUNS[category])
            head = Word(noun.singular, "NOUN")
            owner = self.adjectives(category, head) + [head] if self.chance(0.3) else [head]
            if self.chance(0.25):
                pronoun = Word(self.pick(POSSESSIVE_PRONOUNS), "PRON")
                owner.insert(0, _dep(pronoun, head, "nmod:poss"))
            else:
                owner.insert(0, _dep(Word("the", "DET"), head, "det"))
        owner[-1].space_after = False
        owner.append(_dep(Word("'s", "PART"), _head(owner), "case"))
        return _attach(owner, possessed, "nmod:poss")

    def adjectives(self, category: str, noun: Word) -> list[Word]:
        draw = self.rng.random()
        if draw < 0.6:
            return []
        if draw < 0.9:
            return _attach(self.adjective_phrase(category, degree=0.2), noun, "amod")
        early = [a for a in ADJECTIVES[category] if a not in LATE_ADJECTIVES]
        late = [a for a in ADJECTIVES[category] if a in LATE_ADJECTIVES]
        return [_dep(Word(self.pick(early), "ADJ"), noun, "amod"),
                _dep(Word(self.pick(late), "ADJ"), noun, "amod")]

    def adjective_phrase(self, category: str, degree: float = 0.3) -> list[Word]:
        adjective = Word(self.pick(ADJECTIVES[category]), "ADJ")
        if adjective.form not in UNGRADABLE and self.chance(degree):
            return [_dep(Word(self.pick(DEGREE_ADVERBS), "ADV"), adjective, "advmod"), adjective]
        return [adjective]

    def prepositional(self, preposition: str, category: str, depth: int) -> list[Word]:
        """A preposition and its noun phrase, headed by the noun (the preposition is ``case``)."""
        words = self.nominal(category, case="obj", depth=depth, pronoun=0.1).words
        return [_dep(Word(preposition, "ADP"), _head(words), "case")] + words

    def coordinated(self, first: _Nominal, category: str, case: str) -> _Nominal:
        """"the apple and a pear"; a subject takes only "and" (the verb agrees in the plural)."""
        if first.modified:
            return first
        second = self.nominal(category, case=case, depth=1, pronoun=0.1).words
        conjunction = Word("and" if case == "subj" else self.pick(("and", "and", "or")), "CCONJ")
        _dep(conjunction, _head(second), "cc")
        words = first.words + [conjunction] + _attach(second, _head(first.words), "conj")
        return _Nominal(words, "pl", modified=True)

    def relative_clause(self, category: str, noun: Word, plural: bool) -> list[Word]:
        """"the girl who sang", "the book that she wrote", "the cake Maria baked"."""
        if category in ("person", "animal") and self.chance(0.5):
            pronoun = Word("who" if category == "person" else "that", "PRON")
            verb = self.pick_verb(self.pick(("transitive", "intransitive")), category)
            tense = self.pick(("present", "past"))
            form = "past" if tense == "past" else ("base" if plural else "third")
            clause = self.predicate(verb, form, tense, depth=1, subject=category)
            _dep(pronoun, _head(clause), "nsubj")
            return _attach([pronoun] + clause, noun, "acl:relcl")
        chosen = self.pick([v for v in VERBS["transitive"] if category in v.objects])
        verb = Word(chosen.past, "VERB", chosen.base)
        subject = _attach(self.nominal("person", depth=1, pronoun=0.6).words, verb, "nsubj")
        relative = []
        if self.chance(0.8):
            pronoun = "which" if category != "person" and self.chance(0.4) else "that"
            relative = [_dep(Word(pronoun, "PRON"), verb, "obj")]
        return _attach(relative + subject + [verb], noun, "acl:relcl")

    # -- verbs and clauses
    def pick_verb(self, kind: str, subject: str) -> Verb:
        if kind == "xcomp":
            return self.pick(VERBS["control"] if self.chance(0.7) else VERBS["object_control"])
        frame = {"ccomp": "saying", "link": "linking"}.get(kind, kind)
        verbs = VERBS[frame]
        if subject == "animal":
            verbs = [v for v in verbs if v.base in ANIMAL_VERBS] or verbs
        return self.pick(verbs)

    def chain(self, tense: str, agreement: str, *, negate: bool, question: bool,
              copula: bool) -> tuple[list[tuple[Word, str]], str]:
        """Auxiliaries (and copula) before the predicate with their relations, and the verb form."""
        time = "past" if tense in PAST_TENSES else "present"
        if copula and tense.endswith("progressive"):
            tense = time
        words: list[tuple[Word, str]] = []
        form = "base"
        if tense in ("present", "past"):
            if copula:
                words = [(Word(BE[time, agreement], "AUX", "be"), "cop")]
            elif negate or question:
                do = "did" if time == "past" else ("does" if agreement == "3sg" else "do")
                words = [(Word(do, "AUX", "do"), "aux")]
            else:
                form = "past" if time == "past" else ("third" if agreement == "3sg" else "base")
        elif tense.endswith("progressive"):
            words, form = [(Word(BE[time, agreement], "AUX", "be"), "aux")], "ing"
        elif tense.endswith("perfect"):
            have = "had" if time == "past" else ("has" if agreement == "3sg" else "have")
            words, form = [(Word(have, "AUX", "have"), "aux")], "participle"
            if copula:
                words.append((Word("been", "AUX", "be"), "cop"))
        else:
            modal = "will" if tense == "will" else self.pick(MODALS[1:] if negate else MODALS)
            words = [(Word(modal, "AUX"), "aux")]
            if copula:
                words.append((Word("be", "AUX", "be"), "cop"))
        if negate:
            words.insert(1, (Word("not", "PART"), "advmod"))
        return words, form

    def predicate(self, verb: Verb, form: str, tense: str, depth: int, subject: str) -> list[Word]:
        """The verb with its complements and trailing modifiers, headed by the verb."""
        head = Word(verb.form(form), "VERB", verb.base)
        words = [head]
        open_end = True
        if verb.frame == "transitive":
            category = self.pick(verb.objects)
            obj = self.nominal(category, case="obj", depth=depth, pronoun=0.1)
            if depth == 0 and self.chance(0.08):
                obj = self.coordinated(obj, category, "obj")
            words += _attach(obj.words, head, "obj")
            open_end = not obj.modified
        elif verb.frame == "ditransitive":
            thing = self.nominal(self.pick(("thing", "food", "text")), case="obj", depth=depth + 1)
            recipient = self.nominal("person", case="obj", depth=depth + 1, pronoun=0.3).words
            if self.chance(0.5):
                words += _attach(recipient, head, "iobj") + _attach(thing.words, head, "obj")
            else:
                to = _dep(Word("to", "ADP"), _head(recipient), "case")
                words += _attach(thing.words, head, "obj") + [to] + _attach(recipient, head, "obl")
            open_end = False
        elif verb.frame in ("control", "object_control"):
            if verb.frame == "object_control":
                words += _attach(self.nominal("person", case="obj", depth=1, pronoun=0.3).words,
                                 head, "obj")
            inner_kind = self.pick(("transitive", "transitive", "intransitive"))
            inner = self.pick_verb(inner_kind, "person")
            clause = self.predicate(inner, "base", tense, depth, "person")
            to = _dep(Word("to", "PART"), _head(clause), "mark")
            return words + [to] + _attach(clause, head, "xcomp")
        elif verb.frame == "saying":
            clause = self.clause(depth + 1)
            if self.chance(0.6):
                clause.insert(0, _dep(Word("that", "SCONJ"), _head(clause), "mark"))
            return words + _attach(clause, head, "ccomp")
        elif verb.frame == "linking":
            words += _attach(self.adjective_phrase(subject), head, "xcomp")
            if self.chance(0.12):
                words += _attach_modifier(self.time_phrase(tense), head)
            return words
        intransitive = verb.frame == "intransitive"
        return words + self.verb_modifiers(head, tense, depth, open_end, intransitive)

    def verb_modifiers(self, verb: Word, tense: str, depth: int, open_end: bool,
                       intransitive: bool) -> list[Word]:
        """Trailing adverbs and obliques: manner, place, time (sometimes manner last)."""
        phrases: list[list[Word]] = []
        if self.chance(0.14):
            phrases.append([Word(self.pick(MANNER_ADVERBS + ["well"]), "ADV")])
        if open_end and self.chance(0.45 if intransitive else 0.22):
            if intransitive and self.chance(0.2):
                phrases.append([Word(self.pick(PLACE_ADVERBS), "ADV")])
            else:
                preposition = self.pick(LOCATIVE_PREPOSITIONS)
                phrases.append(self.prepositional(preposition, "place", depth + 1))
        elif open_end and self.chance(0.08):
            phrases.append(self.prepositional("with", "person", depth + 1))
        if self.chance(0.12):
            phrases.append(self.time_phrase(tense))
        if len(phrases) > 1 and len(phrases[0]) == 1 and self.chance(0.3):
            phrases.insert(1, phrases.pop(0))  # "walked into the park slowly"
        words = []
        for phrase in phrases:
            words += _attach_modifier(phrase, verb)
        return words

    def time_phrase(self, tense: str) -> list[Word]:
        """"soon", "on Monday", "in the morning", "after lunch"."""
        draw = self.rng.random()
        if draw < 0.4:
            return [Word(self.pick(TIME_ADVERBS[tense]), "ADV")]
        if draw < 0.6:
            noun = Word(self.pick(DAYS), "PROPN")
            return [_dep(Word("on", "ADP"), noun, "case"), noun]
        if draw < 0.8:
            noun = Word(self.pick(DAY_PARTS), "NOUN")
            return [_dep(Word("in", "ADP"), noun, "case"), _dep(Word("the", "DET"), noun, "det"),
                    noun]
        noun = Word(self.pick(MEALS), "NOUN")
        return [_dep(Word(self.pick(("after", "before")), "ADP"), noun, "case"), noun]

    def copular_predicate(self, category: str, agreement: str) -> list[Word]:
        """"happy", "very tired but happy", "in the kitchen", "a kind teacher"."""
        shape = self.weighted({"adjective": 6, "place": 2 if category != "place" else 0,
                               "noun": 2 if category == "person" else 0})
        if shape == "place":
            if self.chance(0.6):
                return self.prepositional(self.pick(("in", "at", "near", "behind")), "place", 1)
            return self.prepositional(self.pick(("on", "under", "near", "behind")), "thing", 1)
        if shape == "noun":
            noun = self.pick(NOUNS["person"] + COMPOUNDS["person"])
            head = Word(noun.singular if agreement != "pl" else noun.plural, "NOUN", noun.singular)
            words = [head]
            if noun.modifier:
                words.insert(0, _dep(Word(noun.modifier, "NOUN"), head, "compound"))
            if self.chance(0.4):
                words[:0] = _attach(self.adjective_phrase("person", 0.2), head, "amod")
            if agreement != "pl" or self.chance(0.3):
                article = "the" if agreement == "pl" or self.chance(0.3) else "a"
                words.insert(0, _dep(Word(article, "DET"), head, "det"))
            return words
        words = self.adjective_phrase(category)
        if self.chance(0.22):
            second = self.adjective_phrase(category, 0.2)
            while second[-1].form == words[-1].form:
                second = self.adjective_phrase(category, 0.2)
            conjunction = _dep(Word(self.pick(("and", "and", "but")), "CCONJ"), _head(second), "cc")
            words += [conjunction] + _attach(second, _head(words), "conj")
        return words

    def clause(self, depth: int, *, tense: str | None = None, kinds: dict | None = None,
               question: bool = False) -> list[Word]:
        """A full clause headed by its predicate (the verb, or the adjective/noun after ``be``)."""
        kind = self.weighted(kinds or (MAIN_KINDS if depth == 0 else EMBEDDED_KINDS))
        if kind in ("copular", "link"):
            subject_category = self.weighted({"person": 5, "animal": 2, "thing": 2, "food": 1,
                                              "place": 2, "text": 1})
        elif kind in ("transitive", "intransitive"):
            subject_category = "animal" if self.chance(0.2) else "person"
        else:
            subject_category = "person"
        verb = None if kind == "copular" else self.pick_verb(kind, subject_category)
        tense = tense or self.weighted(TENSES)
        if verb and "progressive" in tense and (verb.base in STATIVE or kind in ("link", "ccomp")):
            tense = "past" if tense in PAST_TENSES else "present"
        negate = not question and self.chance(0.1)

        subject = self.nominal(subject_category, depth=depth, pronoun=0.25)
        if depth == 0 and self.chance(0.06):
            subject = self.coordinated(subject, subject_category, "subj")
        auxiliaries, form = self.chain(tense, subject.agreement, negate=negate,
                                       question=question, copula=verb is None)
        if verb is None:
            predicate = self.copular_predicate(subject_category, subject.agreement)
        else:
            predicate = self.predicate(verb, form, tense, depth, subject_category)
        head = _head(predicate)
        if (kind in ("transitive", "intransitive") and depth == 0 and not negate
                and self.chance(0.14)):
            other = self.pick_verb(self.pick(("transitive", "intransitive")), subject_category)
            second = self.predicate(other, form, tense, depth, subject_category)
            conjunction = Word(self.pick(("and", "and", "and", "but", "or")), "CCONJ")
            predicate += [_dep(conjunction, _head(second), "cc")] + _attach(second, head, "conj")

        _attach(subject.words, head, "nsubj")
        chain = [_dep(word, head, relation) for word, relation in auxiliaries]
        adverb = []
        if self.chance(0.12):
            options = [a for a in FREQUENCY_ADVERBS if not (negate and a == "never")]
            if verb is not None and not question and not any(
                    w.head is head and w.form in MANNER_ADVERBS for w in predicate):
                options += [a for a in MANNER_ADVERBS if a != "badly"]
            adverb = [_dep(Word(self.pick(options), "ADV"), head, "advmod")]
        split = 2 if negate else 1  # the adverb follows the first auxiliary (and its "not")
        if question:
            return chain[:1] + subject.words + adverb + chain[1:] + predicate
        return subject.words + chain[:split] + adverb + chain[split:] + predicate

    # -- sentences
    def sentence(self) -> list[Word]:
        shape = self.weighted(SHAPES)
        tense = self.weighted(TENSES)
        end = "."
        if shape == "question":
            words, end = self.clause(0, tense=tense, question=True), "?"
        elif shape == "coordinated":
            first = self.clause(0, tense=tense, kinds=SIMPLE_KINDS)
            second = self.clause(0, kinds=SIMPLE_KINDS)
            head = _head(second)
            joint = [_dep(Word(self.pick(("and", "and", "but")), "CCONJ"), head, "cc")]
            if self.chance(0.4):
                first[-1].space_after = False
                joint.insert(0, _dep(Word(",", "PUNCT"), head, "punct"))
            words = first + joint + _attach(second, _head(first), "conj")
        elif shape == "adverbial":
            words = self.adverbial_sentence(tense)
        elif shape == "fronted":
            words = self.clause(0, tense=tense)
            fronted = _attach_modifier(self.fronted_phrase(tense), _head(words))
            if self.chance(0.75):
                fronted[-1].space_after = False
                fronted.append(_dep(Word(",", "PUNCT"), _head(words), "punct"))
            words = fronted + words
        else:
            words = self.clause(0, tense=tense)
        root = _head(words)
        root.deprel = "root"
        words[-1].space_after = False
        words.append(_dep(Word(end, "PUNCT"), root, "punct"))
        _finish(words)
        return words

    def fronted_phrase(self, tense: str) -> list[Word]:
        """"Suddenly", "Sometimes", "Later", "In the garden", "On Monday"."""
        draw = self.rng.random()
        if draw < 0.3:
            options = ["suddenly", "quietly", "slowly", "sometimes", "usually"]
            options += TIME_ADVERBS[tense]
            return [Word(self.pick([a for a in options if a != "again"]), "ADV")]
        if draw < 0.6:
            return self.prepositional(self.pick(LOCATIVE_PREPOSITIONS), "place", 1)
        while True:  # a temporal PP, not a bare adverb
            phrase = self.time_phrase(tense)
            if len(phrase) > 1:
                return phrase

    def adverbial_sentence(self, tense: str) -> list[Word]:
        """A main clause with an adverbial clause ("because ...", "if ...") before or after it."""
        options = [s for s in SUBORDINATORS if not (tense in PAST_TENSES and s in ("if", "unless"))]
        subordinator = self.pick(options)
        if tense in PAST_TENSES:
            inner_tense = "past progressive" if subordinator == "while" else self.pick(PAST_TENSES)
        elif tense in ("will", "modal") or subordinator in ("if", "unless"):
            inner_tense = "present"
        else:
            inner_tense = self.pick(("present", "present progressive", "present perfect"))
        fronted = self.chance(0.4)
        main_kinds = None if fronted else {k: v for k, v in MAIN_KINDS.items() if k != "ccomp"}
        main = self.clause(0, tense=tense, kinds=main_kinds)
        inner = self.clause(1, tense=inner_tense)
        inner.insert(0, _dep(Word(subordinator, "SCONJ"), _head(inner), "mark"))
        _attach(inner, _head(main), "advcl")
        if not fronted:
            return main + inner
        if self.chance(0.8):
            inner[-1].space_after = False
            inner.append(_dep(Word(",", "PUNCT"), _head(main), "punct"))
        return inner + main


def _vowel_sound(word: str) -> bool:
    word = word.lower()
    if word.startswith(("honest", "hour")):
        return True
    if word.startswith(("use", "uni", "eu", "one")):
        return False
    return word[0] in "aeiou"


def _finish(words: list[Word]) -> None:
    """Choose "a" or "an" from the next word and capitalise the first word."""
    for word, following in zip(words, words[1:]):
        if word.lemma == "a" and word.upos == "DET":
            word.form = "an" if _vowel_sound(following.form) else "a"
    words[0].form = words[0].form[0].upper() + words[0].form[1:]


# ----------------------------------------------------------------------------- public API
def generate(count: int = SENTENCE_COUNT, seed: int = SEED) -> list[list[Word]]:
    """Generate distinct sentences deterministically.

    Args:
        count: how many sentences to return.
        seed: seed of the random generator; the same seed gives the same sentences.

    Returns:
        ``count`` sentences of MIN_WORDS to MAX_WORDS words (punctuation included), each a list
        of ``Word`` in surface order with exactly one root (``head is None``).
    """
    grammar = _Grammar(random.Random(seed))
    sentences, seen = [], set()
    while len(sentences) < count:
        words = grammar.sentence()
        text = _text(words)
        if MIN_WORDS <= len(words) <= MAX_WORDS and text not in seen:
            seen.add(text)
            sentences.append(words)
    return sentences


def _text(words: list[Word]) -> str:
    return "".join(w.form + (" " if w.space_after else "") for w in words).rstrip(" ")


def to_conllu(sentences: list[list[Word]], prefix: str = "gen") -> str:
    """CoNLL-U for generated sentences.

    Args:
        sentences: lists of ``Word`` as returned by ``generate``.
        prefix: sent_id prefix; sentence N gets ``# sent_id = {prefix}-N`` (1-based).

    Returns:
        The text: FORM, LEMMA, UPOS, HEAD and DEPREL filled, ``SpaceAfter=No`` in MISC where the
        next word follows without a space, ``_`` elsewhere; every sentence ends with a blank line.
    """
    blocks = []
    for number, words in enumerate(sentences, 1):
        index = {id(word): position for position, word in enumerate(words, 1)}
        lines = [f"# sent_id = {prefix}-{number}", f"# text = {_text(words)}"]
        for position, word in enumerate(words, 1):
            head = 0 if word.head is None else index[id(word.head)]
            misc = "_" if word.space_after or position == len(words) else "SpaceAfter=No"
            lines.append("\t".join((str(position), word.form, word.lemma, word.upos, "_", "_",
                                    str(head), word.deprel, "_", misc)))
        blocks.append("\n".join(lines) + "\n\n")
    return "".join(blocks)


def main(path: Path | str | None = None, count: int = SENTENCE_COUNT, seed: int = SEED) -> Path:
    """Write the generated treebank.

    Args:
        path: where to write; ``generated.conllu`` next to this file by default.
        count: number of sentences.
        seed: random seed.

    Returns:
        The path written.
    """
    path = Path(path) if path is not None else OUTPUT_PATH
    path.write_bytes(to_conllu(generate(count, seed)).encode("utf-8"))
    return path


if __name__ == "__main__":
    print(main(*sys.argv[1:2]))
