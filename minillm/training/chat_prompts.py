"""Chat questions for an instruct model: the ones a speculator trains on, and the held-out ones the
benchmark measures on.

A proposer for chat must learn what the target says in a chat turn, so it trains on the target's
own answers to chat questions (self-distillation). The training questions are made from templates
and topics; the held-out questions are written apart, on other topics and in other words, so that
a figure measured on them is not a figure on the training set.
"""
TEMPLATES = (
    "Explain {} in simple terms.",
    "What are the main advantages and disadvantages of {}?",
    "Give me three practical tips about {}.",
    "Write a short paragraph about {} for a school newsletter.",
    "What is the history of {}?",
    "How would you teach {} to a beginner?",
    "Summarize the most important facts about {}.",
    "What are common mistakes people make with {}?",
)
TOPICS = (
    "photosynthesis", "the stock market", "machine learning", "the French Revolution", "healthy eating",
    "electric cars", "the water cycle", "time management", "volcanoes", "public speaking", "the immune system",
    "renewable energy", "learning a new language", "black holes", "saving money", "the Roman Empire",
    "climate change", "recursion in programming", "gardening", "the internet", "meditation", "earthquakes",
    "writing a resume", "the human heart", "vaccines", "chess", "databases", "the moon landing", "recycling",
    "running a marathon", "bread baking", "the theory of evolution", "job interviews", "solar panels",
    "the Great Wall of China", "sorting algorithms", "friendship", "coral reefs", "inflation", "jazz music",
    "cybersecurity", "the printing press", "dinosaurs", "camping", "probability", "rainforests",
    "the Olympic Games", "smartphones", "honey bees", "democracy", "Shakespeare", "3D printing", "yoga",
    "the periodic table", "traveling on a budget", "artificial satellites", "cooking pasta", "glaciers",
    "version control with git", "the Renaissance", "sleep", "wind turbines", "caring for a dog", "tides",
)
HELD_OUT = (
    "What is the difference between a list and a tuple in Python?",
    "Can you suggest a simple recipe for dinner tonight?",
    "Why is the sky blue?",
    "Write a polite email asking my manager for a day off next Friday.",
    "How does a bicycle stay upright when it moves?",
    "What should I pack for a weekend trip to the mountains?",
    "Describe how a bill becomes a law.",
    "What are some good habits for staying focused while studying?",
    "Tell me a short story about a robot who learns to paint.",
    "How do airplanes fly?",
    "What is a prime number? Give a few examples.",
    "How can I make my apartment more energy efficient?",
    "Why do cats purr?",
    "Compare living in a big city with living in a small town.",
    "What does a product manager do?",
    "How do I start learning to play the guitar?",
)


def training_questions(n: int) -> list[str]:
    """n distinct questions (up to len(TEMPLATES) * len(TOPICS)): every topic once, then every topic
    again under the next template, and so on."""
    if not 0 < n <= len(TEMPLATES) * len(TOPICS):
        raise ValueError(f"there are {len(TEMPLATES) * len(TOPICS)} training questions, asked for {n}")
    return [TEMPLATES[(i + i // len(TOPICS)) % len(TEMPLATES)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]
