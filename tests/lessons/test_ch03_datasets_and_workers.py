"""Chapter 3's datasets and process probes, and ptlab.workers: what DataLoader workers import."""
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from ptlab import data, workers
from ptlab.lessons.ch03_data import datasets, processes


def test_burn_cpu_is_deterministic_and_rejects_bad_units():
    assert datasets.burn_cpu(100) == datasets.burn_cpu(100)
    with pytest.raises(ValueError, match="units"):
        datasets.burn_cpu(-1)


def test_costly_samples_returns_the_base_samples():
    base = TensorDataset(torch.arange(5))
    costly = datasets.CostlySamples(base, work=10)
    assert len(costly) == 5 and costly[3][0].item() == 3
    with pytest.raises(ValueError, match="work"):
        datasets.CostlySamples(base, work=-5)


def test_squares_dataset_pickles_by_reference_for_spawn():
    dataset = pickle.loads(pickle.dumps(datasets.SquaresDataset(4)))
    assert [dataset[i] for i in range(len(dataset))] == [0, 1, 4, 9]


def test_pad_collate_pads_and_keeps_lengths():
    dataset = datasets.VariableLengthSequences(n=6, min_len=2, max_len=5, seed=0)
    padded, lengths, labels = workers.pad_collate([dataset[i] for i in range(6)])
    assert padded.shape == (6, int(lengths.max())) and labels.shape == (6,)
    for row, length, i in zip(padded, lengths, range(6)):
        assert torch.equal(row[:length], dataset[i][0]) and (row[length:] == 0).all()
    with pytest.raises(ValueError, match="empty"):
        workers.pad_collate([])


def test_skip_none_collate_drops_none_only():
    batch = [(torch.tensor(1), 0), None, (torch.tensor(2), 1)]
    values, labels = workers.skip_none_collate(batch)
    assert values.tolist() == [1, 2] and labels.tolist() == [0, 1]
    assert workers.skip_none_collate([None, None]) is None


def test_normalize_batch_matches_per_sample_arithmetic():
    images = torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = data.normalize_uint8(images, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    assert torch.allclose(out, (images.float() / 255 - 0.5) / 0.25)
    with pytest.raises(ValueError, match="uint8"):
        data.normalize_uint8(images.float(), (0.5,) * 3, (0.25,) * 3)


@pytest.mark.parametrize("context", [None, "spawn"])
def test_numpy_rng_repeats_in_workers_unless_reseeded(context):
    def draws(init_fn):
        loader = DataLoader(datasets.AugmentWithNumpyRng(n=8), batch_size=2, num_workers=2, worker_init_fn=init_fn,
                            multiprocessing_context=context)
        return [v for _ in range(2) for batch in loader for v in batch.tolist()]

    assert len(set(draws(None))) == 4
    assert len(set(draws(workers.seed_worker_numpy_rng))) == 16


def test_seed_worker_numpy_rng_outside_a_worker_says_how_to_use_it():
    with pytest.raises(RuntimeError, match="worker_init_fn"):
        workers.seed_worker_numpy_rng(0)


def test_chunked_values_list_and_array_agree():
    values = np.arange(40_000, dtype=np.float64)
    as_array, as_list = datasets.ChunkedValues(values), datasets.ChunkedValues(values.tolist())
    assert len(as_array) == 2 and as_array[1] == as_list[1] == float(values[20_000:].sum())
    with pytest.raises(ValueError, match="chunk"):
        datasets.ChunkedValues(values[:10])


@pytest.mark.parametrize("context", [None, "spawn"])
def test_counting_dataset_counts_across_workers(context):
    dataset = datasets.CountingDataset(12, context=context)
    list(DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context=context))
    assert dataset.loaded.value == 12


def test_limited_cpus_restores_affinity():
    before = workers.usable_cpus()
    with processes.limited_cpus(1) as count:
        assert count == 1 or not hasattr(__import__("os"), "sched_setaffinity")
    assert workers.usable_cpus() == before
    with pytest.raises(ValueError, match="count"):
        with processes.limited_cpus(0):
            pass


@pytest.fixture
def image_tree(tmp_path):
    from PIL import Image

    for name in ("b_class", "a_class"):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(np.full((4, 4, 3), i * 40, dtype=np.uint8)).save(tmp_path / name / f"{i}.png")
    datasets.corrupt_files([tmp_path / "b_class" / "1.png"], keep_bytes=30)
    return tmp_path


def test_unreadable_files_are_dropped_at_index_time_and_listed(image_tree):
    assert not workers.is_readable_image(image_tree / "b_class" / "1.png")
    folder = workers.image_folder_skipping_unreadable(image_tree)
    assert len(folder) == 5 and folder.skipped == ["b_class/1.png"]
    relabelled = workers.image_folder_skipping_unreadable(image_tree, class_to_idx={"b_class": 0, "a_class": 1})
    assert relabelled.class_to_idx == {"b_class": 0, "a_class": 1} and relabelled.classes == ["b_class", "a_class"]
    assert sorted(relabelled.targets) == [0, 0, 1, 1, 1]


def test_relabel_rejects_a_mapping_with_other_classes(image_tree):
    from torchvision.datasets import ImageFolder

    with pytest.raises(ValueError, match="class_to_idx must name exactly"):
        workers.relabel_image_folder(ImageFolder(str(image_tree)), {"a_class": 0})


def test_dummy_and_none_wrappers(image_tree):
    from torchvision.datasets import ImageFolder
    from torchvision.transforms import v2

    folder = ImageFolder(str(image_tree), transform=v2.PILToTensor())
    bad = [i for i, (path, _) in enumerate(folder.samples) if path.endswith("b_class/1.png")][0]
    image, label = datasets.DummyOnUnreadable(folder, dummy_shape=(3, 4, 4))[bad]
    assert label == -1 and image.shape == (3, 4, 4)
    assert workers.NoneOnUnreadable(folder)[bad] is None
    assert workers.NoneOnUnreadable(folder)[0] is not None


def test_sample_raises_at_only_the_bad_index():
    dataset = datasets.SampleRaisesAt(5, bad_index=2)
    assert dataset[1].item() == 1
    with pytest.raises(ValueError, match="cannot parse the label file") as caught:
        dataset[2]
    assert "2" not in str(caught.value), "the message leaves finding the index to the caller, as most errors do"
    with pytest.raises(ValueError, match="bad_index"):
        datasets.SampleRaisesAt(5, bad_index=5)


def test_decoded_on_access_from_path_and_bytes_and_preloaded_agree(tmp_path):
    images = data.load_arrays(train=True)[0][:5]
    pngs = datasets.encode_png(images)
    paths = []
    for i, blob in enumerate(pngs):
        paths.append(tmp_path / f"{i}.png")
        paths[-1].write_bytes(blob)
    labels = [3, 1, 4, 1, 5]
    for dataset in (datasets.DecodedOnAccess(paths, labels), datasets.DecodedOnAccess(pngs, labels),
                    datasets.Preloaded(images, labels), datasets.Preloaded(images, labels, copy=True)):
        assert len(dataset) == 5
        for i in range(5):
            image, label = dataset[i]
            assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and label == labels[i]
            assert torch.equal(image, torch.from_numpy(images[i].copy()).permute(2, 0, 1))


def test_preloaded_copy_owns_its_memory_and_view_shares_it():
    images = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    view, copied = datasets.Preloaded(images, [0, 1]), datasets.Preloaded(images, [0, 1], copy=True)
    assert view[0][0].data_ptr() == torch.from_numpy(view.images[0]).data_ptr()
    assert copied[0][0].data_ptr() != torch.from_numpy(copied.images[0]).data_ptr()
    images[0] = 7                                                     # the dataset holds its own array
    assert int(view[0][0].max()) == 0


def test_decoding_datasets_reject_bad_input():
    with pytest.raises(ValueError, match="uint8 array"):
        datasets.encode_png(np.zeros((2, 4, 4, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="same length"):
        datasets.DecodedOnAccess([b"x"], [0, 1])
    with pytest.raises(ValueError, match="one label each"):
        datasets.Preloaded(np.zeros((2, 4, 4, 3), dtype=np.uint8), [0])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_torch_threads_is_one_in_each_worker(context):
    import multiprocessing

    if context not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {context} on this platform")
    loader = DataLoader(datasets.TorchThreads(2), batch_size=None, num_workers=2, multiprocessing_context=context)
    assert list(loader) == [1, 1]
