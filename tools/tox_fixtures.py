#!/usr/bin/env python3
"""Reference scores of the toxic-comment-classifier package on our own sentences, for the C++
BiLSTM test (tests/eval_scoring/test_tox_bilstm.cpp): tests/fixtures/scoring/tcc_toxic.json.

  0.3.0: the package's own Python (toxic_classifier.ToxicCommentClassifier.classify, Keras).
  0.2.2: that version's own code builds a different network (Embedding 128 -> LSTM 64) than
         the file it ships holds (the BiLSTM below, in Keras 3's weights layout), so its
         load_weights finds no matching layers and it scores with random initial weights
         (about 0.5 for every label). The faithful reference is the same Keras network as
         0.3.0's code with 0.2.2's file loaded into it (through a `.weights.h5` name, the
         layout it really has).
Needs tensorflow (tensorflow-cpu) and the two wheels, unpacked (scripts/setup.sh downloads
them into ~/.cache/snapserve/tox):
  python3 tools/tox_fixtures.py [CACHE_DIR]
"""
import json
import os
import shutil
import sys
import tempfile
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Our sentences: insults from Shakespeare and Milton (public domain), plain prose, modern
# rudeness without slurs, and edge cases (empty, punctuation only, > 100 words, case, digits,
# out-of-vocabulary words, tabs and newlines).
SENTENCES = [
    "Thou art a boil, a plague sore, an embossed carbuncle in my corrupted blood.",
    "Away, you starvelling, you elf-skin, you dried neat's-tongue, you bull's-pizzle, you stock-fish!",
    "You are as a candle, the better burnt out.",
    "Thou lump of foul deformity.",
    "Out of my sight! thou dost infect my eyes.",
    "Thou whoreson zed, thou unnecessary letter!",
    "More of your conversation would infect my brain.",
    "Your brain is as dry as the remainder biscuit after voyage.",
    "I'll beat thee, but I would infect my hands.",
    "Thou art a base, proud, shallow, beggarly, three-suited, hundred-pound, filthy worsted-stocking knave.",
    "Villain, I have done thy mother.",
    "You scullion! You rampallian! You fustilarian! I'll tickle your catastrophe.",
    "Thine face is not worth sunburning.",
    "Go, prick thy face, and over-red thy fear, thou lily-livered boy.",
    "Thou cream-faced loon, where gott'st thou that goose look?",
    "You are not worth the dust which the rude wind blows in your face.",
    "Peace, ye fat guts!",
    "Thou art unfit for any place but hell.",
    "Hence, horrible villain! or I'll spurn thine eyes like balls before me.",
    "Thou damned and luxurious mountain goat.",
    "A pox o' your throat, you bawling, blasphemous, incharitable dog!",
    "Thou art as loathsome as a toad.",
    "Which way I fly is hell; myself am hell.",
    "Better to reign in hell than serve in heaven.",
    "Of man's first disobedience, and the fruit of that forbidden tree.",
    "The mind is its own place, and in itself can make a heaven of hell.",
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.",
    "To be, or not to be, that is the question.",
    "All the world's a stage, and all the men and women merely players.",
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven.",
    "Now is the winter of our discontent made glorious summer by this sun of York.",
    "The weather is lovely today and the garden is in bloom.",
    "Please send me the quarterly report by Friday afternoon.",
    "The train to Edinburgh leaves at half past nine from platform four.",
    "I baked bread this morning and the whole kitchen smells wonderful.",
    "Thank you for your help with the move, we really appreciate it.",
    "The committee will review the proposal at its next meeting.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "You are an idiot and nobody wants you here.",
    "Shut up, you stupid fool.",
    "What a pathetic, worthless excuse for an article.",
    "This is the dumbest thing I have ever read, you moron.",
    "Get lost, loser.",
    "I will find you and make you regret this.",
    "Go to hell and stay there.",
    "You ignorant clown, learn to read before you edit.",
    "Your edits are vandalism and you should be ashamed.",
    "I disagree with your revert; the source supports the claim.",
    "Could you explain why my edit was removed?",
    "Damn, that was a close match.",
    "",
    "!!! ??? ... ,,,",
    "YOU ARE A FOOL, A KNAVE AND A COWARD",
    "Meet me at 7 tomorrow near gate 12, the tickets cost 45 pounds.",
    "Zyxwvut qwertyuiop flibbertigibbet snollygoster.",
    "line one\twith a tab\nand a second line\r\nand a third",
    " ".join(["the quick brown fox jumps over the lazy dog"] * 14) + " you stupid fool",
    "you stupid fool " + " ".join(["the quick brown fox jumps over the lazy dog"] * 14),
    "Hello", "idiot",
]


def main():
    cache = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/snapserve/tox")
    import numpy
    import tensorflow as tf
    import keras
    tmp = tempfile.mkdtemp()
    out = {"generator": "tools/tox_fixtures.py", "tensorflow": tf.__version__, "keras": keras.__version__,
           "numpy": numpy.__version__, "labels": None, "sentences": SENTENCES, "versions": {}}
    try:
        pkgs = {}
        for v in ("0.3.0", "0.2.2"):
            d = os.path.join(tmp, v)
            zipfile.ZipFile(os.path.join(cache, f"toxic_comment_classifier-{v}-py3-none-any.whl")).extractall(d)
            pkgs[v] = d
        sys.path.insert(0, pkgs["0.3.0"])
        from toxic_classifier import ToxicCommentClassifier
        from toxic_classifier.model import LIST_CLASSES
        out["labels"] = LIST_CLASSES
        clf = ToxicCommentClassifier()
        out["versions"]["0.3.0"] = {"reference": "toxic-comment-classifier 0.3.0 ToxicCommentClassifier.classify",
                                    "scores": [[clf.classify(s)[k] for k in LIST_CLASSES] for s in SENTENCES]}
        old = os.path.join(tmp, "old.weights.h5")
        shutil.copy(os.path.join(pkgs["0.2.2"], "toxic_classifier", "model", "model.h5"), old)
        clf.model.load_weights(old)
        out["versions"]["0.2.2"] = {
            "reference": "0.2.2's model/model.h5 loaded into 0.3.0's Keras network, then classify "
                         "(0.2.2's own code scores with random weights: its network does not match its file)",
            "scores": [[clf.classify(s)[k] for k in LIST_CLASSES] for s in SENTENCES]}
    finally:
        shutil.rmtree(tmp)
    path = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "scoring", "tcc_toxic.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None)
        f.write("\n")
    print(f"wrote {len(SENTENCES)} sentences x {len(out['versions'])} versions to {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
