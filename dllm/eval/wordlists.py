"""Word lists of the project's own ParallelBench generators (`dllm.eval.generators`).

Written for this project: plain, common English first names, surnames and words. They stand in
for the benchmark's own lists, which are not redistributable, so generated data has the same
shape as the official files but different content.

FIRST_NAMES   96 first names, one word each, no duplicates.
LAST_NAMES    180 surnames, one word each, no duplicates.
              The Waiting Line pool is every "First Last" pair, first-name-major (17,280 names).
W2S_EASY      themes of simple words that belong together (a park, a kitchen, a beach, ...);
W2S_HARD      one flat list of abstract or technical words with nothing in common.
              As the benchmark's levels: an easy set takes 4 words of one theme (related common
              words), a medium set one word from each of 4 themes (unrelated common words), a
              hard set 4 words of the flat list (unrelated, mostly uncommon words).

All entries are ASCII letters only (no spaces, commas, quotes, hyphens or apostrophes), so a
rendered list like `["Emma Hughes", "Paul Reed"]` splits back into the same names, and every word
is spelled in US English.
"""

FIRST_NAMES: tuple[str, ...] = (
    "James", "John", "Robert", "Michael", "William", "David", "Richard", "Joseph", "Thomas", "Charles",
    "Daniel", "Matthew", "Anthony", "Mark", "Donald", "Steven", "Paul", "Andrew", "Joshua", "Kenneth",
    "Kevin", "Brian", "George", "Timothy", "Ronald", "Edward", "Jason", "Jeffrey", "Ryan", "Jacob",
    "Gary", "Nicholas", "Eric", "Jonathan", "Stephen", "Larry", "Justin", "Scott", "Brandon", "Benjamin",
    "Samuel", "Gregory", "Frank", "Patrick", "Raymond", "Jack", "Dennis", "Henry", "Peter", "Adam",
    "Mary", "Patricia", "Jennifer", "Linda", "Elizabeth", "Barbara", "Susan", "Jessica", "Sarah", "Karen",
    "Lisa", "Nancy", "Betty", "Margaret", "Sandra", "Ashley", "Kimberly", "Emily", "Donna", "Michelle",
    "Carol", "Amanda", "Melissa", "Deborah", "Stephanie", "Rebecca", "Sharon", "Laura", "Cynthia", "Kathleen",
    "Amy", "Angela", "Helen", "Anna", "Brenda", "Pamela", "Emma", "Nicole", "Samantha", "Katherine",
    "Christine", "Rachel", "Janet", "Olivia", "Julia", "Victoria",
)

LAST_NAMES: tuple[str, ...] = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Miller", "Davis", "Wilson", "Anderson", "Taylor",
    "Moore", "Martin", "Jackson", "Thompson", "White", "Harris", "Clark", "Lewis", "Robinson", "Walker",
    "Young", "Allen", "King", "Wright", "Hill", "Green", "Adams", "Nelson", "Baker", "Hall",
    "Campbell", "Mitchell", "Carter", "Roberts", "Phillips", "Evans", "Turner", "Parker", "Collins", "Edwards",
    "Stewart", "Morris", "Murphy", "Cook", "Rogers", "Morgan", "Cooper", "Peterson", "Reed", "Bailey",
    "Bell", "Kelly", "Howard", "Cox", "Ward", "Richardson", "Wood", "Watson", "Brooks", "Bennett",
    "Gray", "Hughes", "Price", "Sanders", "Myers", "Long", "Ross", "Foster", "Powell", "Jenkins",
    "Perry", "Russell", "Sullivan", "Fisher", "Henderson", "Coleman", "Simmons", "Patterson", "Reynolds", "Hamilton",
    "Graham", "Wallace", "West", "Cole", "Hayes", "Bryant", "Gibson", "Ellis", "Stevens", "Murray",
    "Ford", "Marshall", "Owens", "Harrison", "Kennedy", "Wells", "Dixon", "Hunt", "Palmer", "Black",
    "Robertson", "Stone", "Hawkins", "Dunn", "Perkins", "Hudson", "Spencer", "Gardner", "Stephens", "Payne",
    "Pierce", "Berry", "Matthews", "Arnold", "Wagner", "Willis", "Watkins", "Olson", "Carroll", "Duncan",
    "Snyder", "Hart", "Cunningham", "Bradley", "Lane", "Andrews", "Harper", "Fox", "Riley", "Armstrong",
    "Carpenter", "Weaver", "Greene", "Lawrence", "Elliott", "Sims", "Austin", "Peters", "Franklin", "Lawson",
    "Fields", "Schmidt", "Carr", "Wheeler", "Chapman", "Oliver", "Montgomery", "Richards", "Johnston", "Banks",
    "Meyer", "Bishop", "Howell", "Morrison", "Hansen", "Harvey", "Little", "Burton", "Stanley", "Jacobs",
    "Reid", "Fuller", "Lynch", "Dean", "Gilbert", "Garrett", "Welch", "Larson", "Burke", "Hanson",
    "Bowman", "Fowler", "Porter", "Hunter", "Shaw", "Holmes", "Rice", "Woods", "Barker", "Webb",
)

# Easy: everyday words; the four words of a set share a scene.
W2S_EASY: dict[str, tuple[str, ...]] = {
    "park": ("dog", "park", "ball", "throw", "run", "grass", "tree", "bench", "play", "kid"),
    "kitchen": ("cook", "soup", "pot", "hot", "bread", "eat", "table", "spoon", "bowl", "kitchen"),
    "beach": ("sun", "sand", "sea", "swim", "wave", "shell", "beach", "towel", "boat", "fish"),
    "school": ("book", "read", "teacher", "class", "pen", "write", "desk", "learn", "test", "school"),
    "farm": ("cow", "farm", "milk", "barn", "horse", "hay", "field", "egg", "hen", "tractor"),
    "city": ("car", "street", "bus", "walk", "shop", "road", "city", "light", "drive", "crowd"),
    "home": ("bed", "sleep", "door", "room", "lamp", "chair", "window", "house", "rest", "night"),
    "garden": ("flower", "water", "garden", "seed", "grow", "rain", "soil", "bee", "plant", "green"),
    "party": ("cake", "gift", "party", "candle", "sing", "friend", "balloon", "happy", "song", "card"),
    "winter": ("snow", "cold", "coat", "hat", "ice", "skate", "fire", "warm", "boots", "sled"),
    "music": ("guitar", "drum", "dance", "band", "loud", "music", "piano", "stage", "listen", "song"),
    "market": ("apple", "buy", "market", "basket", "fruit", "bag", "fresh", "price", "sell", "orange"),
}

# Hard: abstract or technical words from unrelated fields; a set is any four of them.
W2S_HARD: tuple[str, ...] = (
    "ambiguity", "photosynthesis", "bureaucracy", "melancholy", "volcano", "symphony", "mortgage", "telescope",
    "algebra", "nostalgia", "glacier", "cathedral", "paradox", "vaccine", "labyrinth", "entropy",
    "jurisdiction", "porcelain", "migration", "satire", "equilibrium", "quarantine", "tapestry", "metaphor",
    "hurricane", "inflation", "anthem", "fossil", "diplomacy", "orchestra", "syntax", "pendulum",
    "carnival", "monopoly", "serenity", "avalanche", "chandelier", "genome", "irony", "turbine",
    "sovereignty", "velocity", "parchment", "hierarchy", "catalyst", "epidemic", "mosaic", "referendum",
    "compass", "solitude", "algorithm", "cactus", "treaty", "enzyme", "skepticism", "lantern",
    "recession", "meteorite", "folklore", "thermostat",
)
