"""Plain text from OSIS, ThML, GBF and plain SWORD entries."""

from __future__ import annotations

import pytest

from qkv.data.sword_markup import strip_markup


@pytest.mark.parametrize("raw, plain", [
    # words kept, Strong's numbers and morphology (attributes) never text
    ('<w lemma="strong:H7225" morph="x">beginning</w> <w lemma="strong:H0430">God</w>', "beginning God"),
    ('and <transChange type="added">was</transChange> <divineName><w>LORD</w></divineName>', "and was LORD"),
    ('<q marker="" who="Jesus"><w>Suffer</w> <seg type="x-nested">it</seg></q>', "Suffer it"),
    # notes dropped with everything in them, nested elements included
    (('darkness.<note placement="foot"><reference>1.4 </reference>the <seg><divineName>LORD'
      '</divineName></seg>: or, <catchWord>x</catchWord></note> And'), "darkness. And"),
    # heading titles dropped; canonical, psalm, acrostic and untyped titles are text
    ('<title level="1" type="main">The First Book</title> In the beginning', "In the beginning"),
    ('<title type="section">Heading</title>Text', "Text"),
    ('<title canonical="true" type="psalm">A <w>Psalm</w> of David.</title> LORD', "A Psalm of David. LORD"),
    ("<title><foreign>ב BETH.</foreign></title> Wherewithal", "ב BETH. Wherewithal"),
    ('<title type="acrostic">ALEPH</title> Blessed', "ALEPH Blessed"),
    # milestones and line markers separate words; white space collapses
    ('<chapter n="1" sID="Gen.1"/>word<lb type="x-p"/>next\n\t  <l level="1" sID="a"/>third',
     "word next third"),
    # entities, pilcrows, USFM leftovers
    ("¶ Salt &amp; light &lt;ok&gt; \\nd JEHOVAH \\+nd*x", "Salt & light <ok> JEHOVAH x"),
    ("", ""),
])
def test_osis(raw, plain):
    assert strip_markup(raw, "OSIS") == plain


def test_attribute_values_with_angle_brackets_and_unclosed_notes():
    assert strip_markup('<w gloss="a > b">word</w> end', "osis") == "word end"
    assert strip_markup("kept <note>dropped to the end", "OSIS") == "kept"


def test_thml():
    raw = '<sync type="Strongs" value="H7225"/>In the beginning<note>a note <i>here</i></note> <i>God</i>'
    assert strip_markup(raw, "ThML") == "In the beginning God"


def test_gbf():
    raw = "<TS>A title<Ts>In the <WH7225>beginning <FI>was<Fi> the<RF>a footnote<Rf> word.<CM>And more"
    assert strip_markup(raw, "GBF") == "In the beginning was the word. And more"


def test_plain_and_unknown():
    assert strip_markup("  a\n b  ", "Plain") == "a b"
    with pytest.raises(ValueError, match="unknown SWORD markup SourceType='TEI'; known: OSIS, ThML, GBF"):
        strip_markup("x", "TEI")
