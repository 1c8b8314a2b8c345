"""A generated, varied instruction set for self-distillation (never the MT-Bench questions).

``distill_prompts(n, seed)`` combines templates with topic lists into ``n`` unique prompts;
``split`` holds out a deterministic share (by a hash of the text) that training never sees.
"""
from __future__ import annotations

import hashlib
import random

TOPICS = (
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "the immune system", "electricity",
    "magnets", "gravity", "climate change", "recycling", "the internet", "computer memory", "encryption",
    "machine learning", "databases", "operating systems", "the stock market", "inflation", "taxes",
    "budgeting", "compound interest", "the Roman Empire", "the printing press", "the industrial revolution",
    "ancient Egypt", "the Renaissance", "democracy", "human rights", "nutrition", "sleep", "exercise",
    "meditation", "stress", "friendship", "teamwork", "leadership", "public speaking", "time management",
    "learning a language", "playing the guitar", "gardening", "composting", "bird migration", "coral reefs",
    "rainforests", "deserts", "earthquakes", "tides", "the moon", "Mars", "the solar system", "rockets",
    "airplanes", "bicycles", "electric cars", "trains", "bridges", "skyscrapers", "architecture", "painting",
    "photography", "music theory", "jazz", "poetry", "novels", "chess", "soccer", "basketball", "the Olympics",
    "coffee", "tea", "bread baking", "cheese making", "vaccines", "bacteria", "viruses", "DNA", "evolution",
    "dinosaurs", "honeybees", "dogs", "cats", "horses", "whales", "penguins", "recycling plastic",
    "solar power", "wind energy", "nuclear energy", "batteries", "smartphones", "social media", "email etiquette",
    "job interviews", "writing a resume", "starting a small business", "customer service", "negotiation",
)
TASKS = (
    "make a cup of coffee", "plant a tree", "write a thank-you note", "prepare for an exam", "clean a kitchen",
    "change a bicycle tire", "save money each month", "start running", "organize a closet", "plan a birthday party",
    "learn to cook rice", "care for a houseplant", "set up a new computer", "back up your files", "pack for a trip",
    "make a budget", "write a cover letter", "train a puppy", "improve your handwriting", "fall asleep faster",
    "reduce screen time", "make new friends in a new city", "prepare a presentation", "study a new language",
    "bake cookies", "fix a leaky faucet", "choose a laptop", "keep a journal", "read more books", "host a dinner",
)
CODE_TASKS = (
    "reverses a string", "checks whether a number is prime", "returns the largest element of a list",
    "counts the vowels in a string", "computes the factorial of n", "merges two sorted lists",
    "removes duplicates from a list while keeping order", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "computes the average of a list of numbers", "finds the second largest number",
    "counts word frequencies in a text", "flattens a nested list", "returns the n-th Fibonacci number",
    "sorts a list of tuples by their second element", "checks whether two strings are anagrams",
    "computes the greatest common divisor of two numbers", "capitalizes every word in a sentence",
    "returns all even numbers from a list", "transposes a matrix given as a list of lists",
    "validates an email address with a simple rule", "computes the sum of digits of an integer",
    "implements binary search", "implements a stack class", "reads a CSV file and returns its rows",
)
LANGUAGES = ("Python", "JavaScript", "Python", "C", "Java")
STYLES = ("a short poem", "a short story", "a haiku", "a limerick", "a motivational paragraph", "a product description",
          "a news headline and a two-sentence summary", "a diary entry", "a dialogue between two friends")
AUDIENCES = ("a child", "a beginner", "a high-school student", "a busy professional", "a grandparent")
NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal", "Lena")
ITEMS = ("apples", "pencils", "books", "marbles", "cookies", "stickers", "coins", "cards", "eggs", "flowers")


def _math_problem(rng: random.Random) -> str:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(1, 9)
    return rng.choice((
        f"{name} has {a} {item} and buys {b} more. Then {name} gives away {c}. How many {item} are left? Explain step by step.",
        f"A box holds {b} {item}. How many {item} are in {a} boxes? Show your work.",
        f"{name} reads {b} pages every day. How many days does it take to read a book of {a * b + c} pages?",
        f"What is {a} multiplied by {b}, plus {c}? Explain the order of operations.",
        f"A shop sells {item} for {b} dollars each. How much do {a} {item} cost with a {c * 5}% discount?",
    ))


def one_template_prompt(rng: random.Random, *, math: bool = True) -> str:
    """One instruction from the templates; ``math=False`` leaves out the arithmetic word problems."""
    topic, other = rng.sample(TOPICS, 2)
    kind = rng.randrange(12) if math else rng.choice((0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11))
    templates = (  # evaluated lazily: each kind draws from ``rng`` only what its text needs
        lambda: f"Explain {topic} to {rng.choice(AUDIENCES)}.",
        lambda: f"How do I {rng.choice(TASKS)}? Give clear steps.",
        lambda: f"What are the main differences between {topic} and {other}?",
        lambda: f"Write {rng.choice(STYLES)} about {topic}.",
        lambda: f"Write a {rng.choice(LANGUAGES)} function that {rng.choice(CODE_TASKS)}.",
        lambda: _math_problem(rng),
        lambda: f"List {rng.randint(3, 7)} interesting facts about {topic}.",
        lambda: f"Give me some advice on {rng.choice(TASKS)}.",
        lambda: f"Summarize the pros and cons of {topic} in a few sentences.",
        lambda: f"Write a short email to {rng.choice(NAMES)} about {topic}.",
        lambda: f"What is {topic}, and why does it matter?",
        lambda: f"Answer briefly: what is one common misconception about {topic}?",
    )
    return templates[kind]()


def distill_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` unique generated instructions (deterministic for a seed)."""
    rng = random.Random(seed)
    prompts: dict[str, None] = {}
    attempts = 0
    while len(prompts) < count:
        prompts.setdefault(one_template_prompt(rng))
        attempts += 1
        if attempts > 50 * count:
            raise ValueError(f"cannot generate {count} unique prompts from the templates")
    return list(prompts)


def is_held_out(prompt: str, share: float = 0.05) -> bool:
    """Deterministic held-out membership by a hash of the text."""
    digest = hashlib.sha256(prompt.encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32 < share
