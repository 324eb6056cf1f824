"""The image captioner (a ViT encoder, a text decoder with cross-attention over the patches): teacher
forcing gives the loss of its logits; a tiny one memorises five pictures' captions and writes them
back greedily; the decoder's cross-attention spans the patches."""

import torch
import torch.nn.functional as F

from qkv.models.vision_builders import build_image_captioner
from qkv.vision.config import model_config

# vocabulary 11 (0 pad, 1 start, 2 end), captions of 4 words + end, 8×8 pictures in 4×4 patches
CAPTIONS = torch.tensor([[3, 4, 5, 6, 2], [7, 8, 9, 10, 2], [3, 8, 5, 10, 2], [10, 9, 8, 7, 2], [6, 6, 4, 4, 2]])


def _model():
    torch.manual_seed(0)
    cfg = model_config("vit-digits", {"image": {"patch": 4}}, vocab_size=11, pad_token_id=0, position="learned",
                       max_len=9, d_model=24, n_heads=3, d_ff=40)
    return build_image_captioner(cfg)


def test_teacher_forcing_loss_is_the_cross_entropy_of_its_logits():
    model = _model().eval()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    out = model(x, labels=CAPTIONS)
    assert out.logits.shape == (5, 5, 11) and out.encoder_last_hidden_state.shape == (5, 5, 24)
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.reshape(-1, 11), CAPTIONS.reshape(-1)))


def test_a_tiny_captioner_memorises_five_pictures():
    model = _model().train()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(120):
        loss = model(x, labels=CAPTIONS).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    written = model.generate(x, max_new_tokens=6, eos_token_id=2)
    assert torch.equal(written[:, 1:6], CAPTIONS), written
    cross = model(x, labels=CAPTIONS).cross_attentions
    assert cross is None or cross[0].shape[-1] == 5  # over [CLS] + 4 patches
