"""Chapter 3 pitfall: converting uint8 images to float without scaling them to [0, 1]."""
from __future__ import annotations

import torch

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.data import MEAN, STD, EmbeddedImages
from ptlab.reference import reference_model


@pitfall(
    id="todtype-without-scale", chapter=3,
    title="v2.ToDtype(torch.float32) without scale=True keeps pixels in 0-255: Normalize then sees values 255x too "
          "large",
    symptom="pixels reach more than 1.5 (up to 255) before Normalize and more than 100 after it, where about -2 to 2 "
            "is expected; the figures show what that does to the shipped model's test accuracy",
    why="""`v2.ToImage()` turns an image into a uint8 tensor (C, H, W) with values 0 to 255. `v2.ToDtype(torch.float32)`
    only changes the dtype: its `scale` argument defaults to False, so 255 stays 255.0. The old `ToTensor()`
    divided by 255 as well, and `Normalize(MEAN, STD)` uses statistics of [0, 1] pixels, so after it the
    values run to several hundred instead of about -2 to 2. Nothing raises: the shapes and the dtype are
    right. A model trained on correctly scaled inputs then sees inputs far outside anything it was trained
    on. The figures show what that does to the shipped reference model (a deliberately short training,
    about 0.52 on the test set with the right inputs).""",
    catch="""Write `v2.ToDtype(torch.float32, scale=True)` (ptlab.data.make_transform does). Print the min, max
    and mean of one batch before training: after Normalize they should be a few units around 0; a
    max near 255 before it, or several hundred after, is this bug.""",
)
def todtype_without_scale(buggy: bool) -> Outcome:
    from torchvision.transforms import v2

    if buggy:
        to_float = v2.ToDtype(torch.float32)                   # BUG: scale=False by default: 0..255 stays 0..255
    else:
        to_float = v2.ToDtype(torch.float32, scale=True)       # FIX: uint8 0..255 -> float 0..1
    test_set = EmbeddedImages(train=False, transform=v2.Compose([v2.ToImage(), to_float]))
    pixels = torch.stack([test_set[i][0] for i in range(500)])               # (500, 3, 32, 32), before Normalize
    labels = torch.tensor(test_set.targets[:500])
    inputs = v2.Normalize(MEAN, STD)(pixels)
    largest = pixels.max().item()
    largest = int(largest) if largest.is_integer() else largest              # 255 or 1: exact, not measured
    with torch.no_grad():
        accuracy = (reference_model().eval()(inputs).argmax(1) == labels).float().mean().item()
    return Outcome(
        figures={"largest pixel before Normalize": largest,
                 "largest |value| after Normalize": inputs.abs().max().item(),
                 "shipped model's accuracy on 500 test images": accuracy},
        checks=[Check("largest pixel before Normalize", largest, "> 1.5"),
                Check("largest |value| after Normalize", inputs.abs().max().item(), "> 100")])
